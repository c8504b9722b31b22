// --trace FILE for a command: a trace session (microllm/profile/trace.h) runs while the command works, and the
// trace is written, atomically, when it ends (or on finish()), with one line on stderr saying where and how much.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace microllm::app {

void add_trace_option(CLI::App* cmd, std::string& path);

class TraceFile {
 public:
  explicit TraceFile(std::string path);  // starts a session when path is not empty
  ~TraceFile();                          // finish(), errors reported on stderr
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;
  void finish();  // stops the session and writes the file (once)

 private:
  std::string path_;
  bool running_ = false;
};

}  // namespace microllm::app
