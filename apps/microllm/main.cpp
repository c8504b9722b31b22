// The `microllm` command: one executable, one thin subcommand per job over the library.
#include <CLI/CLI.hpp>

#include <iostream>

#include "commands.h"
#include "microllm/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"microLLM: study, train, profile and run small language models"};
  app.require_subcommand(1);
  microllm::app::register_info(app);
  microllm::app::register_demo(app);
  microllm::app::register_tokenize(app);
  microllm::app::register_prepare(app);
  microllm::app::register_train(app);
  microllm::app::register_generate(app);
  microllm::app::register_inspect(app);
  microllm::app::register_chat(app);
  microllm::app::register_logits(app);
  microllm::app::register_serve(app);
  microllm::app::register_bench(app);
  try {
    app.parse(argc, argv);  // the chosen subcommand's callback runs here
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const microllm::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
