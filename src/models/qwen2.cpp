// model_type "qwen2": Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen. Biases on q/k/v (never on o).
#include "config_reader.h"

namespace microllm::models {

void write_qwen2_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a qwen2 config has q/k/v biases (attention_bias) and no QK-norm");
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.num_layers;
}

nn::TransformerConfig read_qwen2_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "qwen2");
  c.attention_bias = true;
  // sliding_window is always written; it is used only when use_sliding_window is true.
  r.reject("use_sliding_window", "sliding-window attention is not supported");
  return c;
}

}  // namespace microllm::models
