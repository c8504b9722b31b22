// `microllm serve` driven by real clients over loopback: curl and a Python client speaking the OpenAI wire
// format (tests/serve/serve_clients.sh and openai_client.py) over a tiny random model directory. Each
// skips, saying so, when the microllm executable ($MICROLLM_BIN, else apps/microllm beside this test's build
// folder), curl or python3 is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <sys/wait.h>

#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

fs::path microllm_binary() {
  if (const char* bin = std::getenv("MICROLLM_BIN")) return bin;
  const fs::path self = fs::read_symlink("/proc/self/exe");  // <build>/tests/serve_tests
  return self.parent_path().parent_path() / "apps" / "microllm";
}

void run_clients(const std::string& mode) {
  const fs::path bin = microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  const fs::path script = fs::path(MICROLLM_SOURCE_DIR) / "tests" / "serve" / "serve_clients.sh";
  serve_testing::TinyModelDir dir(testing::fresh_seed());
  const std::string command =
      "bash '" + script.string() + "' '" + bin.string() + "' '" + dir.dir.string() + "' " + mode + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << output;
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(output.find("all checks passed"), std::string::npos) << output;
  std::cout << output;
}

TEST(ServeClients, Curl) { run_clients("curl"); }
TEST(ServeClients, PythonOpenAiClient) { run_clients("python"); }

}  // namespace
}  // namespace microllm
