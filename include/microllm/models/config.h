// Hugging Face config.json <-> nn::TransformerConfig, through one registry of model families
// (src/models/registry.cpp): qwen2 (Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen), qwen3, llama (Llama 2/3/3.1/3.2,
// SmolLM, TinyLlama) and mistral (without a sliding window). A new family is one file plus one row.
// Whatever a family cannot run (a sliding window in use, mixture of experts, an unknown rope_type,
// another activation) is a NotSupportedError naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "microllm/nn/transformer.h"

namespace microllm::models {

// Reads config.json text; `origin` names the file in errors.
nn::TransformerConfig read_config(const std::string& json_text, const std::string& origin = "config.json");
// Reads DIR/config.json, or the file itself.
nn::TransformerConfig read_config_file(const std::string& path);
// config.json text that transformers loads (model_type, architectures and every field it needs).
std::string write_config(const nn::TransformerConfig& config);

// generation_config.json: the ids that end generation and the sampling defaults transformers' generate()
// takes when the caller gives none.
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // eos_token_id: a number or a list
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_k, top_p, min_p, repetition_penalty;
};
// Reads DIR/generation_config.json; nullopt when the directory has none. Text that is not JSON is a
// ParseError naming the file; fields of another type are ignored, as transformers ignores them.
std::optional<GenerationConfig> read_generation_config(const std::string& directory);
// The ids that end generation for a model directory: config.json's eos ids (`config`), generation_config.json's,
// and `extra` (a tokenizer's eos, a chat template's end-of-turn tokens), sorted, without repeats.
std::vector<int64_t> stop_token_ids(const std::string& directory, const nn::TransformerConfig& config,
                                    std::span<const int32_t> extra = {});

std::vector<std::string> supported_model_types();
// "Qwen2ForCausalLM" for "qwen2"; throws NotSupportedError for an unknown model_type.
std::string architecture_of(const std::string& model_type);
// config.json's rope_type of a rotary scaling ("default" for none, "linear", "llama3", "yarn", ...).
const char* rope_scaling_name(RopeScalingType type);

}  // namespace microllm::models
