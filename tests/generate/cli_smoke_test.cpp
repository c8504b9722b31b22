// The microllm command end to end: builds a tiny random Qwen2-style model directory (tests/support/
// tiny_model_dir.h: model.safetensors, config.json, generation_config.json, a byte-level tokenizer.json with
// ChatML tokens, tokenizer_config.json and the Qwen2.5 chat template from the fixtures), then runs
// tests/generate/cli_smoke.sh over it: inspect, generate --model / --checkpoint / --chat / --stop, and chat
// with two piped turns. The microllm executable is $MICROLLM_BIN, else apps/microllm beside this test's
// build folder; the test skips, saying so, when it has not been built.
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

TEST(CliSmoke, InspectGenerateAndChatOnATinyModelDirectory) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  // Not __FILE__: under ccache's base_dir it is a path relative to where the compiler ran.
  const fs::path script = fs::path(MICROLLM_SOURCE_DIR) / "tests" / "generate" / "cli_smoke.sh";
  ASSERT_TRUE(fs::exists(script)) << script;

  const testing::TinyModelDir model(testing::fresh_seed(), 512,
                                    R"({"eos_token_id": [258, 256], "do_sample": true, "top_k": 20})");
  std::string output;
  const int status = testing::run_command("bash '" + script.string() + "' '" + bin.string() + "' '" +
                                              model.dir.string() + "'",
                                          output);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("all checks passed"), std::string::npos) << output;
  std::cout << output;
}

}  // namespace
}  // namespace microllm
