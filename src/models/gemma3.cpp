// model_type "gemma3_text": Gemma 3's text model (270M, 1B; the text half of the larger ones is model_type
// "gemma3", refused as multimodal). Sandwich norms (each sublayer's output normalized before the residual add),
// QK-norm, a GELU-tanh gated MLP, embeddings times sqrt(hidden_size), scores scaled by query_pre_attn_scalar, and
// sliding layers (layer_types, or every layer but each sliding_window_pattern-th) with their own rotary base.
// Its RMSNorms scale by (1 + w): the registry row's norm offset adds the 1 at load and takes it off at save, so
// the modules see the scale itself.
#include <cmath>

#include "config_reader.h"

namespace microllm::models {
namespace {

// The rotary base and scaling of one layer type: transformers >= 5 writes rope_parameters keyed by layer type,
// the Hub's configs rope_theta + rope_scaling (global layers) and rope_local_base_freq (sliding layers).
RopeParams rope_of(const ConfigReader& r, const char* layer_type, const RopeParams& fallback) {
  RopeParams rope = fallback;
  if (!r.has("rope_parameters") || !r.raw("rope_parameters").contains(layer_type)) return rope;
  rope.scaling = {};
  read_rope(r, r.raw("rope_parameters")[layer_type], str_cat("rope_parameters.", layer_type), rope);
  return rope;
}

}  // namespace

void write_gemma3_config(const nn::TransformerConfig& c, nlohmann::json& j) {
  MICROLLM_CHECK(c.qk_norm && !c.attention_bias && c.norm_placement == nn::NormPlacement::sandwich &&
                     c.mlp_activation == nn::MlpActivation::gelu_tanh,
                 NotSupportedError, "config",
                 "a gemma3_text config has QK-norm, sandwich norms, a GELU-tanh MLP and no q/k/v biases");
  MICROLLM_CHECK(!c.sliding_rope || c.sliding_rope->scaling.type == RopeScalingType::none, NotSupportedError, "config",
                 "a gemma3_text config.json holds no rope scaling for its sliding layers");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["attention_bias"] = false;
  j["query_pre_attn_scalar"] =
      c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.resolved_head_dim());
  j["rope_local_base_freq"] = c.sliding_rope ? c.sliding_rope->theta : c.rope.theta;
  j["final_logit_softcapping"] = c.final_logit_softcap > 0 ? nlohmann::json(c.final_logit_softcap) : nullptr;
  j["attn_logit_softcapping"] = nullptr;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    types.push_back(c.window_of(layer) > 0 ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
}

nn::TransformerConfig read_gemma3_config(const ConfigReader& r) {
  nn::TransformerConfig c = read_common_fields(r, "gemma3_text");
  c.head_dim = r.integer_or("head_dim", 256);  // Gemma3TextConfig's default, not hidden_size / heads
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", true);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 131072);
  const std::string act = r.string_or("hidden_activation", r.string_or("hidden_act", "gelu_pytorch_tanh"));
  MICROLLM_CHECK(act == "gelu_pytorch_tanh" || act == "gelu_tanh", NotSupportedError, r.origin(),
                 "field 'hidden_activation' = \"", act, "\" is not supported for gemma3_text (have gelu_pytorch_tanh)");
  c.mlp_activation = nn::MlpActivation::gelu_tanh;
  c.norm_placement = nn::NormPlacement::sandwich;
  c.qk_norm = true;
  r.reject("attention_bias", "biases on the attention projections are not supported for gemma3_text");
  r.reject("attn_logit_softcapping", "soft-capped attention scores are not supported");
  r.reject("use_bidirectional_attention", "bidirectional attention (embedding models) is not supported");
  c.query_pre_attn_scalar = r.number_or("query_pre_attn_scalar", 256);
  MICROLLM_CHECK(c.query_pre_attn_scalar > 0, ParseError, r.origin(), "field 'query_pre_attn_scalar' must be > 0, got ",
                 c.query_pre_attn_scalar);
  c.final_logit_softcap = r.number_or("final_logit_softcapping", 0);
  MICROLLM_CHECK(c.final_logit_softcap >= 0, ParseError, r.origin(),
                 "field 'final_logit_softcapping' must be > 0 or null, got ", c.final_logit_softcap);
  c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));

  c.rope = rope_of(r, "full_attention", c.rope);
  RopeParams local;
  local.theta = r.number_or("rope_local_base_freq", 10000.0);
  local = rope_of(r, "sliding_attention", local);
  c.sliding_rope = local;

  c.sliding_window = r.integer_or("sliding_window", 4096);
  MICROLLM_CHECK(c.sliding_window > 0, ParseError, r.origin(), "field 'sliding_window' must be > 0, got ",
                 c.sliding_window);
  if (r.has("layer_types")) {
    read_layer_types(r, c);
  } else {  // transformers' rule before layer_types: every pattern-th layer is global
    const int64_t pattern = r.integer_or("sliding_window_pattern", 6);
    MICROLLM_CHECK(pattern > 0, ParseError, r.origin(), "field 'sliding_window_pattern' must be > 0, got ", pattern);
    for (int64_t i = 0; i < c.num_layers; ++i) c.sliding_layers.push_back((i + 1) % pattern != 0);
  }
  return c;
}

}  // namespace microllm::models
