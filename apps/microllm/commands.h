// Subcommands of the microllm executable. Each register_* adds a subcommand with its options and the
// callback that runs it; errors propagate to main as microllm::Error.
#pragma once

#include <CLI/CLI.hpp>

namespace microllm::app {

void register_info(CLI::App& app);  // build, devices and threads
void register_demo(CLI::App& app);  // one decoder block from the ops, forward, backward, gradient check
void register_tokenize(CLI::App& app);  // text <-> token ids with a Hugging Face tokenizer
void register_template(CLI::App& app);  // a model's chat template rendered over a conversation
void register_prepare(CLI::App& app);   // text files -> train and validation token files
void register_train(CLI::App& app);     // train a model from scratch (or resume) on token files
void register_generate(CLI::App& app);  // sample text from a checkpoint
void register_inspect(CLI::App& app);   // architecture, parameter count and tensors of a model directory
void register_chat(CLI::App& app);      // talk with a chat model, one user turn per line of stdin
void register_logits(CLI::App& app);    // logits / greedy tokens of ids as safetensors (parity checks)
void register_serve(CLI::App& app);     // an OpenAI-compatible HTTP server over a model
void register_bench(CLI::App& app);     // prefill / decode tokens/s, a llama-bench-style table
void register_trace(CLI::App& app);     // tables of a trace written by --trace
void register_align(CLI::App& app);     // activations / gradients point by point against a transformers dump
void register_attention(CLI::App& app);  // attention weights of a layer: top keys per query, a heat map

}  // namespace microllm::app
