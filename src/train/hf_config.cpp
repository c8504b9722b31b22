#include "microllm/train/hf_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"

namespace microllm::train {

using json = nlohmann::json;

namespace {

const json& field(const json& j, const char* name, const std::string& origin) {
  MICROLLM_CHECK(j.contains(name) && !j[name].is_null(), ParseError, origin, "missing field '", name, "'");
  return j[name];
}

int64_t int_field(const json& j, const char* name, const std::string& origin) {
  const json& v = field(j, name, origin);
  MICROLLM_CHECK(v.is_number_integer(), ParseError, origin, "field '", name, "' must be an integer, got ", v.dump());
  return v.get<int64_t>();
}

double number_or(const json& j, const char* name, double fallback, const std::string& origin) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  MICROLLM_CHECK(j[name].is_number(), ParseError, origin, "field '", name, "' must be a number, got ", j[name].dump());
  return j[name].get<double>();
}

bool bool_or(const json& j, const char* name, bool fallback, const std::string& origin) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  MICROLLM_CHECK(j[name].is_boolean(), ParseError, origin, "field '", name, "' must be true or false, got ",
                 j[name].dump());
  return j[name].get<bool>();
}

void read_rope_scaling(const json& scaling, RopeScaling& out, const std::string& origin) {
  if (scaling.is_null()) return;
  MICROLLM_CHECK(scaling.is_object(), ParseError, origin, "rope_scaling must be an object or null");
  std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (type == "default") return;
  if (type == "linear") {
    out.type = RopeScalingType::linear;
    out.factor = number_or(scaling, "factor", 1.0, origin);
  } else if (type == "llama3") {
    out.type = RopeScalingType::llama3;
    out.factor = number_or(scaling, "factor", 8.0, origin);
    out.low_freq_factor = number_or(scaling, "low_freq_factor", 1.0, origin);
    out.high_freq_factor = number_or(scaling, "high_freq_factor", 4.0, origin);
    out.original_max_position_embeddings =
        static_cast<int64_t>(number_or(scaling, "original_max_position_embeddings", 8192, origin));
  } else {
    throw NotSupportedError(origin, str_cat("rope scaling '", type, "' is not supported (have linear, llama3)"));
  }
}

const char* architecture(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  throw NotSupportedError(
      "config", str_cat("model_type '", model_type, "' has no Hugging Face export (have llama, qwen2, qwen3)"));
}

}  // namespace

nn::TransformerConfig config_from_hf_json(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw ParseError(origin, str_cat("not JSON: ", e.what()));
  }
  MICROLLM_CHECK(j.is_object(), ParseError, origin, "a config must be a JSON object");
  nn::TransformerConfig c;
  c.model_type = field(j, "model_type", origin).get<std::string>();
  MICROLLM_CHECK(
      c.model_type == "llama" || c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "mistral",
      NotSupportedError, origin, "model_type '", c.model_type,
      "' is not supported (have llama, qwen2, qwen3, mistral)");
  c.vocab_size = int_field(j, "vocab_size", origin);
  c.hidden_size = int_field(j, "hidden_size", origin);
  c.intermediate_size = int_field(j, "intermediate_size", origin);
  c.num_layers = int_field(j, "num_hidden_layers", origin);
  c.num_heads = int_field(j, "num_attention_heads", origin);
  c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                       ? int_field(j, "num_key_value_heads", origin)
                       : c.num_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? int_field(j, "head_dim", origin) : 0;
  c.rms_norm_eps = number_or(j, "rms_norm_eps", 1e-6, origin);
  c.rope.theta = number_or(j, "rope_theta", 10000.0, origin);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {  // transformers >= 5
    c.rope.theta = number_or(j["rope_parameters"], "rope_theta", c.rope.theta, origin);
    read_rope_scaling(j["rope_parameters"], c.rope.scaling, origin);
  }
  if (j.contains("rope_scaling")) read_rope_scaling(j["rope_scaling"], c.rope.scaling, origin);
  c.tie_word_embeddings = bool_or(j, "tie_word_embeddings", false, origin);  // transformers' default
  c.max_position_embeddings =
      j.contains("max_position_embeddings") ? int_field(j, "max_position_embeddings", origin) : 2048;
  c.initializer_range = number_or(j, "initializer_range", 0.02, origin);
  const std::string act = j.value("hidden_act", std::string("silu"));
  MICROLLM_CHECK(act == "silu", NotSupportedError, origin, "hidden_act '", act, "' is not supported (have silu)");
  MICROLLM_CHECK(!bool_or(j, "mlp_bias", false, origin), NotSupportedError, origin, "mlp_bias is not supported");
  MICROLLM_CHECK(!bool_or(j, "use_sliding_window", false, origin), NotSupportedError, origin,
                 "sliding-window attention is not supported");
  const bool attention_bias = bool_or(j, "attention_bias", false, origin);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases (and none on o_proj)
  } else {
    MICROLLM_CHECK(!attention_bias, NotSupportedError, origin, "attention_bias for ", c.model_type,
                   " puts a bias on o_proj too, which this model does not have");
  }
  c.qk_norm = c.model_type == "qwen3";
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    c.bos_token_id = j["bos_token_id"].get<int64_t>();
  if (j.contains("eos_token_id")) {
    const json& eos = j["eos_token_id"];
    if (eos.is_number_integer()) c.eos_token_ids.push_back(eos.get<int64_t>());
    if (eos.is_array()) {
      for (const json& e : eos) {
        if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int64_t>());
      }
    }
  }
  try {
    c.validate();
  } catch (const ValueError& e) {
    throw ParseError(origin, e.what());
  }
  return c;
}

nn::TransformerConfig load_hf_config(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  return config_from_hf_json(io::read_text_file(file), file);
}

std::string hf_config_json(const nn::TransformerConfig& c) {
  c.validate();
  MICROLLM_CHECK(c.model_type != "qwen2" || c.attention_bias, NotSupportedError, "config",
                 "a qwen2 export needs attention_bias (Qwen2 always has q/k/v biases)");
  MICROLLM_CHECK(c.model_type == "qwen2" || !c.attention_bias, NotSupportedError, "config",
                 "attention_bias exports only as qwen2 (", c.model_type, " would add an o_proj bias)");
  MICROLLM_CHECK(c.model_type == "qwen3" || !c.qk_norm, NotSupportedError, "config",
                 "qk_norm exports only as qwen3, not ", c.model_type);
  json j;
  j["architectures"] = {architecture(c.model_type)};
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
    case RopeScalingType::linear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.scaling.factor}};
      break;
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
  if (c.model_type == "llama") {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (c.model_type == "qwen2") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  } else if (c.model_type == "qwen3") {
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::TransformerLM& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const nn::ParameterInfo& p : model.named_parameters()) out.emplace_back(p.name, p.variable->value());
  return out;
}

void load_model_weights(nn::TransformerLM& model, const std::string& file_or_directory) {
  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(file_or_directory);
  for (const nn::ParameterInfo& p : model.named_parameters()) {
    MICROLLM_CHECK(checkpoint.contains(p.name), IoError, file_or_directory, "has no tensor '", p.name, "'");
    const Tensor stored = checkpoint.get(p.name);
    MICROLLM_CHECK(stored.shape() == p.variable->shape(), ShapeError, file_or_directory, "tensor '", p.name,
                   "' has shape ", stored.shape(), " but the model expects ", p.variable->shape());
    Tensor value = p.variable->value();
    value.copy_(stored);
  }
}

}  // namespace microllm::train
