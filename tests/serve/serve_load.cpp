// benchmarks/serve_load.py against a real `microllm serve` on a tiny random model over loopback: 4 streaming
// clients for 3 seconds (completions, chat, and two clients leaving their requests half-way), started and
// stopped by the script's --spawn. Passes when the script exits 0 (no request failed: status 200, well-formed
// events, [DONE]; nothing running and no KV block held after the run) and at least one request completed. A program of its own (not in serve_tests' glob) so that tests/CMakeLists.txt gives it a
// timeout. Skips, saying so, when the microllm executable ($MICROLLM_BIN, else apps/microllm beside this
// test's build folder) or python3 is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_testing.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

void run_load(const std::string& extra_flags) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm)";
  std::string ignored;
  if (testing::run_command("command -v python3", ignored) != 0) GTEST_SKIP() << "python3 is not installed";
  const fs::path script = fs::path(MICROLLM_SOURCE_DIR) / "benchmarks" / "serve_load.py";
  const testing::TinyModelDir dir(testing::fresh_seed());
  const fs::path json = dir.dir / "load.json";
  const std::string server = "'" + bin.string() + "' serve --model '" + dir.dir.string() +
                             "' --model-name tiny --port 0 --threads 1 --max-batch 4 --http-threads 8";
  std::string output;
  const int status = testing::run_command("python3 '" + script.string() + "' --spawn \"" + server +
                                              "\" --server-log '" + (dir.dir / "server.log").string() +
                                              "' --clients 4 --duration 3 --max-tokens 24 --startup-timeout 30 " +
                                              "--request-timeout 30 --json '" + json.string() + "' " + extra_flags,
                                          output);
  std::cout << output;
  ASSERT_EQ(status, 0) << output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no " << json;
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_GE(summary["requests_completed"].get<int64_t>(), 1) << summary.dump(2);
  EXPECT_EQ(summary["errors"].get<int64_t>(), 0) << summary.dump(2);
  EXPECT_GT(summary["completion_tokens"].get<int64_t>(), 0) << summary.dump(2);
  EXPECT_EQ(summary["usage_missing"].get<int64_t>(), 0) << "microllm serve sends the usage chunk asked for";
  // After the run: nothing running, every KV block free.
  ASSERT_TRUE(summary["after_run"].is_object()) << summary.dump(2);
  EXPECT_EQ(summary["after_run"]["requests_running"], 0) << summary.dump(2);
  EXPECT_EQ(summary["after_run"]["kv_blocks_used"], 0) << summary.dump(2);
  // The server's own time to first token, from /metrics: one observation per request it answered (requests
  // left half-way before their first token have none).
  const nlohmann::json& server_ttft = summary["server_ttft_bucket_s"];
  ASSERT_TRUE(server_ttft.is_object()) << summary.dump(2);
  if (summary["abandoned_requests"].get<int64_t>() == 0) {
    EXPECT_EQ(server_ttft["count"].get<int64_t>(), summary["requests_completed"].get<int64_t>()) << summary.dump(2);
  } else {
    EXPECT_GE(server_ttft["count"].get<int64_t>(), summary["requests_completed"].get<int64_t>()) << summary.dump(2);
  }
  EXPECT_LE(server_ttft["p50"].get<double>(), server_ttft["max"].get<double>()) << summary.dump(2);
  EXPECT_GT(summary["ttft_first_request_s"]["max"].get<double>(), 0) << summary.dump(2);
}

TEST(ServeLoad, CompletionsFourClientsThreeSeconds) { run_load(""); }
TEST(ServeLoad, ChatFourClientsThreeSeconds) { run_load("--chat"); }
// Two of the four clients leave every request half-way, streaming and not in turn: the run must end with no
// request running and every KV block free (the script counts it an error otherwise).
TEST(ServeLoad, HalfTheClientsLeaveHalfWay) { run_load("--disconnect-fraction 0.5 --leave-max-tokens 400"); }

}  // namespace
}  // namespace microllm
