// Typed reads of config.json fields, each error naming the file and the field, and the registry of model
// families (internal header; tests include it to register a family of their own).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "microllm/core/error.h"
#include "microllm/nn/transformer.h"

namespace microllm::models {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, std::string origin) : json_(json), origin_(std::move(origin)) {}

  const std::string& origin() const { return origin_; }
  bool has(const char* field) const { return json_.contains(field) && !json_[field].is_null(); }
  const nlohmann::json& raw(const char* field) const {
    MICROLLM_CHECK(has(field), ParseError, origin_, "missing field '", field, "'");
    return json_[field];
  }

  int64_t integer(const char* field) const {
    const nlohmann::json& v = raw(field);
    MICROLLM_CHECK(v.is_number_integer(), ParseError, origin_, "field '", field, "' must be an integer, got ",
                   v.dump());
    return to_int64(v, field);
  }
  // An integer JSON value as int64_t; above INT64_MAX (parsed as unsigned) is an error, not a wrap to < 0.
  int64_t to_int64(const nlohmann::json& v, const char* field) const {
    MICROLLM_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), ParseError,
                   origin_, "field '", field, "' = ", v.dump(), " is out of range (at most ", INT64_MAX, ")");
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* field, int64_t fallback) const { return has(field) ? integer(field) : fallback; }

  double number(const char* field) const {
    const nlohmann::json& v = raw(field);
    MICROLLM_CHECK(v.is_number(), ParseError, origin_, "field '", field, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  double number_or(const char* field, double fallback) const { return has(field) ? number(field) : fallback; }

  bool boolean_or(const char* field, bool fallback) const {
    if (!has(field)) return fallback;
    const nlohmann::json& v = raw(field);
    MICROLLM_CHECK(v.is_boolean(), ParseError, origin_, "field '", field, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  }

  std::string string_or(const char* field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    const nlohmann::json& v = raw(field);
    MICROLLM_CHECK(v.is_string(), ParseError, origin_, "field '", field, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }

  // A field whose presence (with a truthy value) means a feature this runtime does not have.
  void reject(const char* field, const char* why) const {
    if (!has(field)) return;
    const nlohmann::json& v = raw(field);
    const bool in_use = v.is_boolean() ? v.get<bool>() : v.is_number() ? v.get<double>() != 0 : true;
    MICROLLM_CHECK(!in_use, NotSupportedError, origin_, "field '", field, "' = ", v.dump(), ": ", why);
  }

 private:
  const nlohmann::json& json_;
  std::string origin_;
};

// The fields every Llama-like family shares (sizes, norm eps, rope, tying, special ids, the MLP's activation).
nn::TransformerConfig read_common_fields(const ConfigReader& r, const std::string& model_type);

// A rope_parameters (transformers 5) or rope_scaling object into `rope`: its rope_theta where given, and its scaling
// (linear, llama3, yarn, longrope's short factors, dynamic; "default" leaves the scaling as it is). null: nothing.
// `field` names it in errors.
void read_rope(const ConfigReader& r, const nlohmann::json& fields, const std::string& field, RopeParams& rope);
// layer_types: one "sliding_attention" or "full_attention" per layer, into c.sliding_layers.
void read_layer_types(const ConfigReader& r, nn::TransformerConfig& c);

// Sliding-window attention as transformers reads it: `layer_types` ("sliding_attention" / "full_attention" per
// layer) where given; else Mistral's `sliding_window` (every layer; null: none), or Qwen2/Qwen3's
// `use_sliding_window` with `sliding_window` for the layers from `max_window_layers` on.
enum class SlidingWindowFields { mistral, qwen };
void read_sliding_window(const ConfigReader& r, SlidingWindowFields fields, nn::TransformerConfig& c);
// And written back: Mistral's field or Qwen's three, and layer_types where some layers are full.
void write_sliding_window(const nn::TransformerConfig& c, SlidingWindowFields fields, nlohmann::json& j);

// A model family: config.json's model_type, the transformers class that loads it, how its config.json reads
// into a TransformerConfig (the family's description of its block), and what it adds to the fields every
// config.json gets when one is written (write_config; nullptr: nothing). src/models/ has one file per family and
// one registry row each (registry.cpp); register_family adds one at run time (a test's or a plugin's family),
// which then loads, trains and runs like the built-in ones: the modules and the runner build from the
// description alone.
// A checkpoint tensor that holds several parameters stacked along dim 0 (Phi-3's qkv_proj, gate_up_proj): `stored`
// and `parts` are name suffixes after a module path ("model.layers.3."); the loader reads each part as a row range
// of the stored tensor, and save_model writes them stacked again.
struct StackedWeight {
  std::string stored;
  std::vector<std::string> parts;
};

struct Family {
  std::string model_type;
  std::string architecture;
  std::function<nn::TransformerConfig(const ConfigReader&)> read;
  std::function<void(const nn::TransformerConfig&, nlohmann::json&)> write;
  std::vector<StackedWeight> stacked = {};  // the checkpoint's stacked tensors, if any
  // The checkpoint's RMSNorm weights hold the scale minus this (Gemma: the norm scales by 1 + w): the loader adds
  // it, save_model takes it off, so the modules hold the scale itself.
  double norm_offset = 0;
};
// The family of `model_type` (NotSupportedError naming the supported ones).
Family family_of(const std::string& model_type, const std::string& origin);
// ValueError when a family of that model_type exists.
void register_family(Family family);

// The built-in families' readers and writers (one file each).
nn::TransformerConfig read_gemma3_config(const ConfigReader& r);
nn::TransformerConfig read_llama_config(const ConfigReader& r);
nn::TransformerConfig read_mistral_config(const ConfigReader& r);
nn::TransformerConfig read_phi3_config(const ConfigReader& r);
nn::TransformerConfig read_qwen2_config(const ConfigReader& r);
nn::TransformerConfig read_qwen3_config(const ConfigReader& r);
void write_gemma3_config(const nn::TransformerConfig& c, nlohmann::json& j);
void write_llama_config(const nn::TransformerConfig& c, nlohmann::json& j);
void write_mistral_config(const nn::TransformerConfig& c, nlohmann::json& j);
void write_phi3_config(const nn::TransformerConfig& c, nlohmann::json& j);
void write_qwen2_config(const nn::TransformerConfig& c, nlohmann::json& j);
void write_qwen3_config(const nn::TransformerConfig& c, nlohmann::json& j);

}  // namespace microllm::models
