// model_type "qwen2": Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen. Biases on q/k/v (never on o).
#include "config_reader.h"

namespace microllm::models {

void write_qwen2_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a qwen2 config has q/k/v biases (attention_bias) and no QK-norm");
  write_sliding_window(c, SlidingWindowFields::qwen, j);
}

nn::TransformerConfig read_qwen2_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "qwen2");
  c.attention_bias = true;
  read_sliding_window(r, SlidingWindowFields::qwen, c);
  return c;
}

}  // namespace microllm::models
