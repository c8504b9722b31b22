// The registry of model families, and config.json written back for transformers.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "config_reader.h"
#include "core/json_text.h"
#include "microllm/io/atomic_file.h"
#include "microllm/models/config.h"

namespace microllm::models {
namespace {

using json = nlohmann::json;

struct Family {
  const char* model_type;
  const char* architecture;  // the transformers class
  nn::TransformerConfig (*read)(const ConfigReader&);
};

// One row per family.
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", read_llama_config},
    {"mistral", "MistralForCausalLM", read_mistral_config},
    {"qwen2", "Qwen2ForCausalLM", read_qwen2_config},
    {"qwen3", "Qwen3ForCausalLM", read_qwen3_config},
};

const Family& family_of(const std::string& model_type, const std::string& origin) {
  for (const Family& f : kFamilies) {
    if (model_type == f.model_type) return f;
  }
  std::string known;
  for (const Family& f : kFamilies) known += (known.empty() ? "" : ", ") + std::string(f.model_type);
  throw NotSupportedError(origin, str_cat("field 'model_type' = \"", model_type, "\" is not supported (have ", known, ")"));
}

}  // namespace

nn::TransformerConfig read_config(const std::string& json_text, const std::string& origin) {
  const json j = detail::parse_json(json_text, origin, "not valid JSON");
  MICROLLM_CHECK(j.is_object(), ParseError, origin, "a config must be a JSON object");
  const ConfigReader reader(j, origin);
  const std::string model_type = reader.string_or("model_type", "");
  MICROLLM_CHECK(!model_type.empty(), ParseError, origin, "missing field 'model_type'");
  nn::TransformerConfig config = family_of(model_type, origin).read(reader);
  try {
    config.validate();
  } catch (const ValueError& e) {
    throw ParseError(origin, e.what());
  }
  return config;
}

nn::TransformerConfig read_config_file(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  return read_config(io::read_text_file(file), file);
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies) out.emplace_back(f.model_type);
  return out;
}

std::string architecture_of(const std::string& model_type) { return family_of(model_type, "config").architecture; }

std::string write_config(const nn::TransformerConfig& c) {
  c.validate();
  // The flags each family can express: an export must not change the architecture.
  MICROLLM_CHECK(c.model_type != "qwen2" || c.attention_bias, NotSupportedError, "config",
                 "a qwen2 config needs attention_bias (Qwen2 always has q/k/v biases)");
  MICROLLM_CHECK(c.model_type == "qwen2" || !c.attention_bias, NotSupportedError, "config",
                 "q/k/v biases export only as qwen2 (", c.model_type, " would add an o_proj bias)");
  MICROLLM_CHECK((c.model_type == "qwen3") == c.qk_norm, NotSupportedError, "config",
                 "qk_norm exists exactly in qwen3, not in ", c.model_type);
  json j;
  j["architectures"] = {architecture_of(c.model_type)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.resolved_head_dim();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope.theta;
  switch (c.rope.scaling.type) {
    case RopeScalingType::none: j["rope_scaling"] = nullptr; break;
    case RopeScalingType::linear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.scaling.factor}}; break;
    case RopeScalingType::llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope.scaling.factor},
                           {"low_freq_factor", c.rope.scaling.low_freq_factor},
                           {"high_freq_factor", c.rope.scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope.scaling.original_max_position_embeddings}};
      break;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.model_type == "llama" || c.model_type == "mistral") {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  if (c.model_type == "llama") j["pretraining_tp"] = 1;
  if (c.model_type == "mistral") j["sliding_window"] = nullptr;
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.model_type == "qwen3") j["attention_bias"] = false;
  return j.dump(2) + "\n";
}

}  // namespace microllm::models
