// model_type "llama": Llama 2/3/3.1/3.2, SmolLM, TinyLlama. Optional llama3/linear rope scaling; no biases.
#include "config_reader.h"

namespace microllm::models {

void write_llama_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(!c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a llama config has neither q/k/v biases (qwen2) nor QK-norm (qwen3)");
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
}

nn::TransformerConfig read_llama_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "llama");
  // attention_bias puts a bias on q, k, v and o; this runtime's attention has none on o_proj.
  r.reject("attention_bias", "biases on the attention projections are not supported for llama");
  return c;
}

}  // namespace microllm::models
