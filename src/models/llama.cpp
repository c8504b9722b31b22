// model_type "llama": Llama 2/3/3.1/3.2, SmolLM, TinyLlama. Optional llama3/linear rope scaling; no biases.
#include "config_reader.h"

namespace microllm::models {

nn::TransformerConfig read_llama_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "llama");
  // attention_bias puts a bias on q, k, v and o; this runtime's attention has none on o_proj.
  r.reject("attention_bias", "biases on the attention projections are not supported for llama");
  return c;
}

}  // namespace microllm::models
