// Hugging Face model files for the TransformerLM: config.json <-> nn::TransformerConfig (model_type llama,
// qwen2, qwen3) and weights by their Hugging Face names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "microllm/nn/transformer.h"

namespace microllm::train {

// Reads a config.json's text: model_type, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta (or rope_parameters),
// rope_scaling (linear, llama3), tie_word_embeddings, attention_bias (qwen2 always has q/k/v biases),
// qk-norm for qwen3, max_position_embeddings, bos/eos ids. What this model cannot express (an o_proj
// bias, an MLP bias, another activation) is a NotSupportedError; a missing field a ParseError.
nn::TransformerConfig config_from_hf_json(const std::string& json_text, const std::string& origin = "config.json");
// A config.json file, or a directory holding one.
nn::TransformerConfig load_hf_config(const std::string& path);
// The config.json that transformers loads (architectures, model_type and every field it reads).
std::string hf_config_json(const nn::TransformerConfig& config);

// The model's tensors under their Hugging Face names (tied heads: no lm_head.weight), as stored.
std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::TransformerLM& model);
// Copies weights by name from a safetensors file or a model directory into the model's parameters
// (converting dtype and device). Every parameter must be present (IoError naming the missing one);
// lm_head.weight is ignored when the head is tied.
void load_model_weights(nn::TransformerLM& model, const std::string& file_or_directory);

}  // namespace microllm::train
