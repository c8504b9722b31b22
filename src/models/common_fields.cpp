// The config.json fields shared by the Llama-like families.
#include "config_reader.h"

namespace microllm::models {

void read_rope(const ConfigReader& r, const nlohmann::json& fields, const std::string& field, RopeParams& rope) {
  if (fields.is_null()) return;
  MICROLLM_CHECK(fields.is_object(), ParseError, r.origin(), "field '", field, "' must be an object or null");
  const ConfigReader s(fields, r.origin());
  rope.theta = s.number_or("rope_theta", rope.theta);
  RopeScaling& out = rope.scaling;
  const std::string type = s.string_or("rope_type", s.string_or("type", "default"));
  if (type == "default") return;
  if (type == "linear") {
    out.type = RopeScalingType::linear;
    out.factor = s.number("factor");
  } else if (type == "llama3") {
    out.type = RopeScalingType::llama3;
    out.factor = s.number("factor");
    out.low_freq_factor = s.number_or("low_freq_factor", 1.0);
    out.high_freq_factor = s.number_or("high_freq_factor", 4.0);
    out.original_max_position_embeddings = s.integer_or("original_max_position_embeddings", 8192);
  } else if (type == "yarn") {
    out.type = RopeScalingType::yarn;
    out.factor = s.number("factor");
    out.original_max_position_embeddings =
        s.integer_or("original_max_position_embeddings", r.integer_or("max_position_embeddings", 2048));
    out.beta_fast = s.number_or("beta_fast", 32.0);
    out.beta_slow = s.number_or("beta_slow", 1.0);
    out.attention_factor = s.number_or("attention_factor", 0.0);
    s.reject("mscale", "yarn's mscale (DeepSeek) is not supported");
    s.reject("mscale_all_dim", "yarn's mscale_all_dim (DeepSeek) is not supported");
    MICROLLM_CHECK(s.boolean_or("truncate", true), NotSupportedError, r.origin(), "field '", field,
                   ".truncate' = false is not supported");
  } else if (type == "dynamic") {
    out.type = RopeScalingType::dynamic;
    out.factor = s.number("factor");
    out.original_max_position_embeddings =
        s.integer_or("original_max_position_embeddings", r.integer_or("max_position_embeddings", 2048));
  } else if (type == "longrope" || type == "su") {  // "su": Phi-3's first name for it
    // The short factors: contexts up to original_max_position_embeddings, where transformers uses them too.
    out.type = RopeScalingType::longrope;
    out.original_max_position_embeddings =
        s.integer_or("original_max_position_embeddings", r.integer_or("original_max_position_embeddings", 0));
    MICROLLM_CHECK(out.original_max_position_embeddings > 0, ParseError, r.origin(), "field '", field,
                   "' (longrope) needs original_max_position_embeddings");
    out.factor = static_cast<double>(r.integer_or("max_position_embeddings", 2048)) /
                 static_cast<double>(out.original_max_position_embeddings);
    out.attention_factor = s.number_or("attention_factor", 0.0);
    const auto factors = [&](const char* name) {
      const nlohmann::json& list = s.raw(name);
      MICROLLM_CHECK(list.is_array(), ParseError, r.origin(), "field '", field, ".", name, "' must be a list");
      std::vector<double> out_list;
      for (const nlohmann::json& f : list) {
        MICROLLM_CHECK(f.is_number(), ParseError, r.origin(), "field '", field, ".", name, "' holds ", f.dump());
        out_list.push_back(f.get<double>());
      }
      return out_list;
    };
    out.frequency_factors = factors("short_factor");
    out.long_factors = factors("long_factor");
  } else {
    throw NotSupportedError(r.origin(),
                            str_cat("field '", field, ".rope_type' = \"", type,
                                    "\" is not supported (have default, linear, llama3, yarn, longrope, dynamic)"));
  }
}

nn::TransformerConfig read_common_fields(const ConfigReader& r, const std::string& model_type) {
  nn::TransformerConfig c;
  c.model_type = model_type;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_layers = r.integer("num_hidden_layers");
  c.num_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  c.head_dim = r.integer_or("head_dim", 0);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.rope.theta = r.number_or("rope_theta", 10000.0);
  if (r.has("rope_parameters")) read_rope(r, r.raw("rope_parameters"), "rope_parameters", c.rope);  // transformers 5
  if (r.has("rope_scaling")) read_rope(r, r.raw("rope_scaling"), "rope_scaling", c.rope);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 2048);
  c.initializer_range = r.number_or("initializer_range", 0.02);
  // The gated MLP's activation: SwiGLU or GeGLU (transformers' gelu_pytorch_tanh, the tanh approximation).
  const std::string act = r.string_or("hidden_act", "silu");
  if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") {
    c.mlp_activation = nn::MlpActivation::gelu_tanh;
  } else {
    MICROLLM_CHECK(act == "silu", NotSupportedError, r.origin(), "field 'hidden_act' = \"", act,
                   "\" is not supported (have silu, gelu_pytorch_tanh)");
  }
  r.reject("mlp_bias", "a bias in the MLP is not supported");
  r.reject("num_experts", "mixture-of-experts models are not supported");
  r.reject("num_local_experts", "mixture-of-experts models are not supported");
  if (r.has("bos_token_id") && r.raw("bos_token_id").is_number_integer()) c.bos_token_id = r.integer("bos_token_id");
  if (r.has("eos_token_id")) {
    const nlohmann::json& eos = r.raw("eos_token_id");
    if (eos.is_number_integer()) {
      c.eos_token_ids.push_back(r.to_int64(eos, "eos_token_id"));
    } else if (eos.is_array()) {
      for (const auto& id : eos) {
        MICROLLM_CHECK(id.is_number_integer(), ParseError, r.origin(), "field 'eos_token_id' holds a non-integer ",
                       id.dump());
        c.eos_token_ids.push_back(r.to_int64(id, "eos_token_id"));
      }
    } else {
      throw ParseError(r.origin(), str_cat("field 'eos_token_id' must be an integer or a list, got ", eos.dump()));
    }
  }
  return c;
}

void read_layer_types(const ConfigReader& r, nn::TransformerConfig& c) {
  const nlohmann::json& types = r.raw("layer_types");
  MICROLLM_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == c.num_layers, ParseError, r.origin(),
                 "field 'layer_types' must list one type for each of the ", c.num_layers, " layers");
  for (const nlohmann::json& t : types) {
    MICROLLM_CHECK(t == "sliding_attention" || t == "full_attention", NotSupportedError, r.origin(),
                   "field 'layer_types' has ", t.dump(),
                   ": only \"sliding_attention\" and \"full_attention\" are supported");
    c.sliding_layers.push_back(t == "sliding_attention");
  }
}

void read_sliding_window(const ConfigReader& r, SlidingWindowFields fields, nn::TransformerConfig& c) {
  const bool qwen = fields == SlidingWindowFields::qwen;
  if (qwen && !r.boolean_or("use_sliding_window", false)) return;  // sliding_window is written but unused then
  if (!r.has("sliding_window")) {
    MICROLLM_CHECK(!qwen, ParseError, r.origin(), "field 'use_sliding_window' is true but 'sliding_window' is missing");
    return;
  }
  c.sliding_window = r.integer("sliding_window");
  MICROLLM_CHECK(c.sliding_window > 0, ParseError, r.origin(), "field 'sliding_window' must be > 0, got ",
                 c.sliding_window);
  if (r.has("layer_types")) {
    read_layer_types(r, c);
  } else if (qwen) {
    const int64_t first = r.integer_or("max_window_layers", 28);  // transformers' default
    for (int64_t i = 0; i < c.num_layers; ++i) c.sliding_layers.push_back(i >= first);
  }
}

void write_sliding_window(const nn::TransformerConfig& c, SlidingWindowFields fields, nlohmann::json& j) {
  const bool qwen = fields == SlidingWindowFields::qwen;
  const bool windowed = c.sliding_window > 0;
  j["sliding_window"] = windowed ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  if (qwen) {
    j["use_sliding_window"] = windowed;
    int64_t first = 0;  // the layers from max_window_layers on slide
    while (first < static_cast<int64_t>(c.sliding_layers.size()) && !c.sliding_layers[static_cast<size_t>(first)]) {
      ++first;
    }
    j["max_window_layers"] = windowed ? first : c.num_layers;
  }
  if (windowed && !c.sliding_layers.empty()) {
    nlohmann::json types = nlohmann::json::array();
    for (bool sliding : c.sliding_layers) types.push_back(sliding ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
}

}  // namespace microllm::models
