// Subcommands of the microllm executable. Each register_* adds a subcommand with its options and the
// callback that runs it; errors propagate to main as microllm::Error.
#pragma once

#include <CLI/CLI.hpp>

namespace microllm::app {

void register_info(CLI::App& app);  // build, devices and threads

}  // namespace microllm::app
