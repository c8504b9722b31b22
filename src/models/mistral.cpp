// model_type "mistral": the Llama architecture with sliding-window attention (sliding_window; null: none).
#include "config_reader.h"

namespace microllm::models {

void write_mistral_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(!c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a mistral config has neither q/k/v biases (qwen2) nor QK-norm (qwen3)");
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  write_sliding_window(c, SlidingWindowFields::mistral, j);
}

nn::TransformerConfig read_mistral_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "mistral");
  read_sliding_window(r, SlidingWindowFields::mistral, c);
  return c;
}

}  // namespace microllm::models
