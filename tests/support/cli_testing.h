// Running the microllm executable from a test: where it is, and a shell command's exit code and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace microllm::testing {

// $MICROLLM_BIN, else apps/microllm of the build tree this test program belongs to (<build>/tests/<test>).
inline std::filesystem::path microllm_binary() {
  if (const char* bin = std::getenv("MICROLLM_BIN")) return bin;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return self.parent_path().parent_path() / "apps" / "microllm";
}

// Runs `command` through the shell and appends its stdout and stderr to `output`; returns the exit code
// (-1 when the command did not exit normally or could not start).
inline int run_command(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// How often `part` occurs in `text` (overlapping occurrences counted).
inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace microllm::testing
