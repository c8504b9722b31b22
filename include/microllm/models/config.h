// Hugging Face config.json <-> nn::TransformerConfig, through one registry of model families
// (src/models/registry.cpp): qwen2 (Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen), qwen3, llama (Llama 2/3/3.1/3.2,
// SmolLM, TinyLlama) and mistral (without a sliding window). A new family is one file plus one row.
// Whatever a family cannot run (a sliding window in use, mixture of experts, an unknown rope_type,
// another activation) is a NotSupportedError naming the field.
#pragma once

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

std::vector<std::string> supported_model_types();
// "Qwen2ForCausalLM" for "qwen2"; throws NotSupportedError for an unknown model_type.
std::string architecture_of(const std::string& model_type);

}  // namespace microllm::models
