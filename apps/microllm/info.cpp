// `microllm info`: what this build has and what this machine offers.
#include <iostream>

#include "commands.h"
#include "microllm/microllm.h"

namespace microllm::app {

void register_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Show the build, the devices and the CPU threads");
  cmd->callback([] {
    std::cout << "microLLM " << MICROLLM_VERSION_STRING << "\n"
              << "CPU threads: " << num_threads() << "\n"
              << "CUDA devices: " << cuda_device_count() << "\n";
  });
}

}  // namespace microllm::app
