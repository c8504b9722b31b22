// Subcommands of the microllm executable. Each register_* adds a subcommand with its options and the
// callback that runs it; errors propagate to main as microllm::Error.
#pragma once

#include <CLI/CLI.hpp>

namespace microllm::app {

void register_info(CLI::App& app);  // build, devices and threads
void register_demo(CLI::App& app);  // one decoder block from the ops, forward, backward, gradient check
void register_tokenize(CLI::App& app);  // text <-> token ids with a Hugging Face tokenizer

}  // namespace microllm::app
