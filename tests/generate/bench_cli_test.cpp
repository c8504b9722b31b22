// `microllm bench` end to end on the CPU: the tiny preset with random weights, a short prefill and decode at
// batches 1 and 2, one repetition; the JSON report must hold exactly the expected rows with positive tokens/s
// (the default workload 2048:2:64 does not fit the preset's 2048-token window and is skipped with a note),
// and the table must be printed. A prompt longer than the window, given on the command line, is an error.
// The executable is $MICROLLM_BIN, else apps/microllm beside this test's build folder; the tests skip when
// it has not been built.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_testing.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

using testing::microllm_binary;
using testing::run_command;

TEST(BenchCli, TinyPresetOnTheCpuWritesTheExpectedRows) {
  const fs::path bin = microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  const fs::path json_path = fs::temp_directory_path() / ("microllm-bench-" + std::to_string(getpid()) + ".json");
  std::string output;
  const std::string command = std::string("'").append(bin.string()).append("' bench --preset tiny -p 16 -n 4 -b 1,2 "
                                                                          "-r 1 --device cpu --explain --json '")
                                  .append(json_path.string())
                                  .append("'");
  const int rc = run_command(command, output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("| model | params | device | dtype | batch | test | t/s min | t/s median | t/s max |"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("command: "), std::string::npos) << output;
  EXPECT_NE(output.find("machine: CPU "), std::string::npos) << output;
  EXPECT_NE(output.find("| tiny | "), std::string::npos) << output;
  EXPECT_NE(output.find("kernels: on the CPU every fused op runs its composition"), std::string::npos) << output;
  EXPECT_NE(output.find("| attention | q [1, 4, 16, 32] f32, keys 16 | f32 vectorized loops"), std::string::npos)
      << output;  // the tiny preset's pp16 (4 heads of 32)

  std::ifstream in(json_path);
  ASSERT_TRUE(in.good()) << json_path;
  const nlohmann::json report = nlohmann::json::parse(in);
  fs::remove(json_path);
  EXPECT_EQ(report.at("device"), "cpu");
  EXPECT_EQ(report.at("dtype"), "f32");
  EXPECT_EQ(report.at("repetitions"), 1);
  EXPECT_EQ(report.at("model").at("name"), "tiny");
  EXPECT_GT(report.at("model").at("parameters").get<int64_t>(), 0);

  struct Expected {
    const char* test;
    const char* kind;
    int64_t batch, prompt, new_tokens;
  };
  const Expected expected[] = {{"pp16", "prefill", 1, 16, 0}, {"tg4", "decode", 1, 0, 4}, {"tg4", "decode", 2, 0, 4}};
  const nlohmann::json& rows = report.at("rows");
  ASSERT_EQ(rows.size(), std::size(expected)) << report.dump(2);
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& row = rows[i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row.at("test"), expected[i].test);
    EXPECT_EQ(row.at("kind"), expected[i].kind);
    EXPECT_EQ(row.at("batch").get<int64_t>(), expected[i].batch);
    EXPECT_EQ(row.at("prompt").get<int64_t>(), expected[i].prompt);
    EXPECT_EQ(row.at("new_tokens").get<int64_t>(), expected[i].new_tokens);
    ASSERT_EQ(row.at("tokens_per_second").size(), 1u);
    ASSERT_EQ(row.at("seconds").size(), 1u);
    const double lo = row.at("tokens_per_second_min"), mid = row.at("tokens_per_second_median"),
                 hi = row.at("tokens_per_second_max");
    EXPECT_GT(lo, 0);
    EXPECT_LE(lo, mid);
    EXPECT_LE(mid, hi);
    EXPECT_GT(row.at("seconds")[0].get<double>(), 0);
  }
  // The default workload needs 2048 + 64 - 1 positions: more than the tiny preset's window.
  const nlohmann::json& skipped = report.at("skipped");
  ASSERT_EQ(skipped.size(), 1u) << report.dump(2);
  EXPECT_EQ(skipped[0].at("test"), "pp2048+tg64");
  EXPECT_EQ(skipped[0].at("batch"), 2);
}

TEST(BenchCli, ExplicitTestsThatCannotRunAreErrors) {
  const fs::path bin = microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  // The quoted program, then the arguments (built with append: g++ 12's -Wrestrict misfires on
  // "literal" + std::string&& at -O3).
  auto command = [&](const char* args) { return std::string("'").append(bin.string()).append("' ").append(args); };
  std::string output;
  EXPECT_EQ(run_command(command("bench --preset tiny -p 4096 -n 0 --workload none -r 1"), output), 1) << output;
  EXPECT_NE(output.find("window"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(run_command(command("bench --preset tiny -p 0 -n 2 -b 0 --workload none -r 1"), output), 1) << output;
  EXPECT_NE(output.find("batch 0"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(run_command(command("bench --preset tiny -p 0 -n 0 --workload 16:2 -r 1"), output), 1) << output;
  EXPECT_NE(output.find("PROMPT:BATCH:NEW_TOKENS"), std::string::npos) << output;
}

}  // namespace
}  // namespace microllm
