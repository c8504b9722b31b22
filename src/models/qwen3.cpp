// model_type "qwen3": RMSNorm on q and k per head before RoPE (QK-norm), explicit head_dim, no biases.
#include "config_reader.h"

namespace microllm::models {

void write_qwen3_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(c.qk_norm && !c.attention_bias, NotSupportedError, "config",
                 "a qwen3 config has QK-norm and no q/k/v biases");
  j["attention_bias"] = false;
  write_sliding_window(c, SlidingWindowFields::qwen, j);
}

nn::TransformerConfig read_qwen3_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "qwen3");
  c.qk_norm = true;
  r.reject("attention_bias", "biases on the attention projections are not supported for qwen3");
  read_sliding_window(r, SlidingWindowFields::qwen, c);
  return c;
}

}  // namespace microllm::models
