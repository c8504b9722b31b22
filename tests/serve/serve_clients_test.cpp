// `microllm serve` driven by real clients over loopback: curl and a Python client speaking the OpenAI wire
// format (tests/serve/serve_clients.sh and openai_client.py) over a tiny random model directory. Each
// skips, saying so, when the microllm executable ($MICROLLM_BIN, else apps/microllm beside this test's build
// folder), curl or python3 is missing; the official OpenAI SDK for Node.js (openai_sdk_client.cjs) when node
// or the SDK (scripts/fetch-node-tools.sh) is.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "cli_testing.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

void run_clients(const std::string& mode) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  const fs::path script = fs::path(MICROLLM_SOURCE_DIR) / "tests" / "serve" / "serve_clients.sh";
  const testing::TinyModelDir dir(testing::fresh_seed());
  std::string output;
  const int status = testing::run_command(
      "bash '" + script.string() + "' '" + bin.string() + "' '" + dir.dir.string() + "' " + mode, output);
  ASSERT_NE(status, -1) << output;
  if (status == 77) GTEST_SKIP() << output;
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("all checks passed"), std::string::npos) << output;
  std::cout << output;
}

TEST(ServeClients, Curl) { run_clients("curl"); }
TEST(ServeClients, PythonOpenAiClient) { run_clients("python"); }
TEST(ServeClients, OfficialOpenAiSdkForNode) { run_clients("openai-sdk"); }

}  // namespace
}  // namespace microllm
