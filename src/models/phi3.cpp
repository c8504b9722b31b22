// model_type "phi3": Phi-3 (mini, medium). The Llama block with q/k/v stored as one qkv_proj and gate/up as one
// gate_up_proj (read as views, written stacked again), and a sliding window on every layer. The 128k variants'
// longrope scaling runs its short factors (common_fields.cpp); partial rotary embeddings (Phi-4-mini) are refused.
#include "config_reader.h"

namespace microllm::models {

void write_phi3_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(!c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a phi3 config has neither q/k/v biases (qwen2) nor QK-norm (qwen3)");
  j["attention_bias"] = false;
  j["partial_rotary_factor"] = 1.0;
  write_sliding_window(c, SlidingWindowFields::mistral, j);
}

nn::TransformerConfig read_phi3_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "phi3");
  MICROLLM_CHECK(r.number_or("partial_rotary_factor", 1.0) == 1.0, NotSupportedError, r.origin(),
                 "field 'partial_rotary_factor' = ", r.number("partial_rotary_factor"),
                 ": rotary embeddings over part of each head are not supported");
  r.reject("attention_bias", "biases on the attention projections are not supported for phi3");
  read_sliding_window(r, SlidingWindowFields::mistral, c);
  return c;
}

}  // namespace microllm::models
