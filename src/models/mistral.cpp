// model_type "mistral": the Llama architecture; only without a sliding window.
#include "config_reader.h"

namespace microllm::models {

void write_mistral_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(!c.attention_bias && !c.qk_norm, NotSupportedError, "config",
                 "a mistral config has neither q/k/v biases (qwen2) nor QK-norm (qwen3)");
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["sliding_window"] = nullptr;
}

nn::TransformerConfig read_mistral_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "mistral");
  if (r.has("sliding_window")) {
    const int64_t window = r.integer("sliding_window");
    // A window at least as long as the context never masks anything: full attention.
    MICROLLM_CHECK(window >= c.max_position_embeddings, NotSupportedError, r.origin(), "field 'sliding_window' = ",
                   window, " is shorter than max_position_embeddings (", c.max_position_embeddings,
                   "): sliding-window attention is not supported");
  }
  return c;
}

}  // namespace microllm::models
