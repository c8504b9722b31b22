// The registry of model families, and config.json written back for transformers.
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "config_reader.h"
#include "core/json_text.h"
#include "microllm/io/atomic_file.h"
#include "microllm/models/config.h"

namespace microllm::models {
namespace {

using json = nlohmann::json;

// The families: one row each for the built-in ones, then those registered at run time.
std::mutex families_mutex;
std::vector<Family>& families() {
  static std::vector<Family> all = {
      {"gemma3_text", "Gemma3ForCausalLM", read_gemma3_config, write_gemma3_config, {}, /*norm_offset=*/1.0},
      {"llama", "LlamaForCausalLM", read_llama_config, write_llama_config},
      {"mistral", "MistralForCausalLM", read_mistral_config, write_mistral_config},
      {"phi3",
       "Phi3ForCausalLM",
       read_phi3_config,
       write_phi3_config,
       {{"self_attn.qkv_proj.weight",
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
        {"mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}}}},
      {"qwen2", "Qwen2ForCausalLM", read_qwen2_config, write_qwen2_config},
      {"qwen3", "Qwen3ForCausalLM", read_qwen3_config, write_qwen3_config},
  };
  return all;
}

}  // namespace

Family family_of(const std::string& model_type, const std::string& origin) {
  std::lock_guard lock(families_mutex);
  std::string known;
  for (const Family& f : families()) {
    if (model_type == f.model_type) return f;
    known += (known.empty() ? "" : ", ") + f.model_type;
  }
  throw NotSupportedError(origin,
                          str_cat("field 'model_type' = \"", model_type, "\" is not supported (have ", known, ")"));
}

namespace {

const char* activation_name(nn::MlpActivation a) { return a == nn::MlpActivation::silu ? "silu" : "gelu_pytorch_tanh"; }

// A written config must read back to the same block: the family's model_type implies some of it (Qwen2's
// biases, Qwen3's QK-norm, a placement), and a description it cannot express is refused, not silently changed.
void check_round_trip(const nn::TransformerConfig& c, const nn::TransformerConfig& back) {
  auto same = [&](bool equal, const char* field) {
    MICROLLM_CHECK(equal, NotSupportedError, "config", "a ", c.model_type, " config.json cannot express this ", field,
                   ": written and read back it would change");
  };
  same(back.attention_bias == c.attention_bias, "attention_bias");
  same(back.qk_norm == c.qk_norm, "qk_norm");
  same(back.norm_placement == c.norm_placement, "norm placement");
  same(back.mlp_activation == c.mlp_activation, "MLP activation");
  bool same_windows = true;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) same_windows &= back.window_of(layer) == c.window_of(layer);
  same(same_windows, "sliding window");
}

// config.json's rope_scaling object of a scaling (null: none), the fields each type reads.
json rope_scaling_json(const RopeScaling& s) {
  if (s.type == RopeScalingType::none) return nullptr;
  json j = {{"rope_type", rope_scaling_name(s.type)}};
  if (s.type != RopeScalingType::longrope) j["factor"] = s.factor;  // longrope's is max / original
  if (s.type == RopeScalingType::llama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == RopeScalingType::yarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
  }
  if (s.type == RopeScalingType::longrope) {
    j["short_factor"] = s.frequency_factors;
    j["long_factor"] = s.long_factors;
  }
  if (s.type != RopeScalingType::linear) j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;  // yarn, longrope
  return j;
}

}  // namespace

const char* rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::none: return "default";
    case RopeScalingType::linear: return "linear";
    case RopeScalingType::llama3: return "llama3";
    case RopeScalingType::yarn: return "yarn";
    case RopeScalingType::longrope: return "longrope";
    case RopeScalingType::dynamic: return "dynamic";
  }
  return "?";
}

void register_family(Family family) {
  MICROLLM_CHECK(!family.model_type.empty() && family.read, ValueError, "models",
                 "a family needs a model_type and a reader");
  std::lock_guard lock(families_mutex);
  for (const Family& f : families()) {
    MICROLLM_CHECK(f.model_type != family.model_type, ValueError, "models", "a family of model_type '",
                   family.model_type, "' is registered already");
  }
  families().push_back(std::move(family));
}

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
  std::lock_guard lock(families_mutex);
  std::vector<std::string> out;
  for (const Family& f : families()) out.push_back(f.model_type);
  return out;
}

std::string architecture_of(const std::string& model_type) { return family_of(model_type, "config").architecture; }

std::string write_config(const nn::TransformerConfig& c) {
  c.validate();
  const Family family = family_of(c.model_type, "config");
  json j;
  j["architectures"] = {family.architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.resolved_head_dim();
  j["hidden_act"] = activation_name(c.mlp_activation);
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope.theta;
  j["rope_scaling"] = rope_scaling_json(c.rope.scaling);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (family.write) family.write(c, j);
  check_round_trip(c, family.read(ConfigReader(j, "config")));
  return j.dump(2) + "\n";
}

}  // namespace microllm::models
