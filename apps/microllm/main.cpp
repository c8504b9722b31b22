// The `microllm` command: one executable, one thin subcommand per job over the library.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "commands.h"
#include "microllm/core/error.h"
#include "microllm/version.h"

int main(int argc, char** argv) {
  CLI::App app{"microLLM: study, train, profile and run small language models"};
  app.require_subcommand(1);
  app.set_version_flag("-V,--version", "microllm " MICROLLM_VERSION_STRING, "Print the version and exit");
  microllm::app::register_info(app);
  microllm::app::register_demo(app);
  microllm::app::register_tokenize(app);
  microllm::app::register_template(app);
  microllm::app::register_prepare(app);
  microllm::app::register_train(app);
  microllm::app::register_generate(app);
  microllm::app::register_inspect(app);
  microllm::app::register_chat(app);
  microllm::app::register_logits(app);
  microllm::app::register_serve(app);
  microllm::app::register_bench(app);
  microllm::app::register_trace(app);
  microllm::app::register_align(app);
  microllm::app::register_attention(app);
  // A first word that names no command: say which commands there are.
  if (argc > 1 && argv[1][0] != '-') {
    const std::vector<CLI::App*> commands = app.get_subcommands([](CLI::App*) { return true; });
    std::string names;
    bool known = false;
    for (const CLI::App* command : commands) {
      known = known || command->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + command->get_name();
    }
    if (!known) {
      std::cerr << "error: unknown command '" << argv[1] << "'; the commands are " << names
                << " (microllm --help says what each does)\n";
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  try {
    app.parse(argc, argv);  // the chosen subcommand's callback runs here
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // usage errors, --help, --version, and a subcommand's CLI::RuntimeError(status)
  } catch (const microllm::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
