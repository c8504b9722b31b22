// `microllm trace summarize FILE`: the tables of a trace written by --trace (or any Chrome trace-event JSON): the
// spans that took the most time, per layer and per op, and where each GPU sat idle while the host did what.
// Also the --trace option's session (trace_file.h), shared by train, generate, bench and serve.
#include <iostream>
#include <memory>

#include "commands.h"
#include "microllm/core/error.h"
#include "microllm/profile/summary.h"
#include "microllm/profile/trace.h"
#include "trace_file.h"

namespace microllm::app {

void add_trace_option(CLI::App* cmd, std::string& path) {
  cmd->add_option("--trace", path,
                  "Write a trace of the run (Chrome trace-event JSON: open it in ui.perfetto.dev; `microllm trace "
                  "summarize FILE` prints its tables)");
}

TraceFile::TraceFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  profile::start();
  running_ = true;
}

void TraceFile::finish() {
  if (!running_) return;
  running_ = false;
  const profile::Trace trace = profile::stop();
  trace.write(path_);
  const profile::TraceSummary summary = profile::summarize(trace, 1);
  std::cerr << "trace: " << path_ << " (" << trace.events.size() << " events over " << summary.wall_ms
            << " ms; microllm trace summarize " << path_ << ")" << std::endl;
}

TraceFile::~TraceFile() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "trace: " << e.what() << std::endl;
  }
}

void register_trace(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("trace", "Read traces written by --trace");
  cmd->require_subcommand(1);
  CLI::App* summarize = cmd->add_subcommand("summarize", "Tables of a trace: top spans, layers, ops, GPU idle gaps");
  auto file = std::make_shared<std::string>();
  auto rows = std::make_shared<size_t>(20);
  summarize->add_option("file", *file, "A trace (Chrome trace-event JSON)")->required();
  summarize->add_option("--rows", *rows, "Rows a table at most")->capture_default_str();
  summarize->callback([file, rows] {
    std::cout << profile::to_markdown(profile::summarize(profile::Trace::read(*file), *rows));
  });
}

}  // namespace microllm::app
