// What `microllm generate` and `microllm chat` share (defined in generate.cpp): the sampling flags, loading
// a model for inference, the stop ids and defaults a model directory asks for, and streaming ids as text.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "microllm/generate/generate.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::app {

// --max-tokens, the sampling flags, --seed and --stop, into `options`.
void add_sampling_options(CLI::App* cmd, generate::GenerateOptions& options);
std::unique_ptr<nn::TransformerLM> load_inference_model(const std::string& directory, const std::string& device,
                                                        const std::string& dtype, int threads, bool verbose);
// Stop strings unescaped; the stop ids of config.json, generation_config.json and the tokenizer (with
// `chat`, the template's end-of-turn tokens too); generation_config.json's sampling values for the flags
// the user did not give (as transformers does).
void prepare_generate_options(const std::string& directory, const CLI::App& cmd, const nn::TransformerConfig& config,
                              const Tokenizer* tokenizer, bool chat, generate::GenerateOptions& options);
// Ids -> text for streaming: the tokenizer's StreamDecoder (special tokens skipped), or bytes.
generate::TextDecoder make_text_decoder(const std::optional<Tokenizer>& tokenizer,
                                        std::shared_ptr<StreamDecoder>& keep_alive);

}  // namespace microllm::app
