// The microllm command itself: --version and -V, an unknown command (which lists the commands), and a chat
// session that meets a line that is not UTF-8 (reported, skipped, and the session goes on) on a tiny random
// model directory (tests/support/tiny_model_dir.h). The executable is $MICROLLM_BIN, else apps/microllm
// beside this test's build folder; the tests skip, saying so, when it has not been built.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_testing.h"
#include "microllm/version.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

TEST(CliCommands, VersionAndAnUnknownCommand) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  for (const char* flag : {"--version", "-V"}) {
    std::string out;
    EXPECT_EQ(testing::run_command(bin.string() + " " + flag, out), 0) << flag << ": " << out;
    EXPECT_EQ(out, "microllm " MICROLLM_VERSION_STRING "\n") << flag;
  }
  std::string out;
  EXPECT_NE(testing::run_command(bin.string() + " trian --steps 3", out), 0) << out;
  EXPECT_NE(out.find("unknown command 'trian'"), std::string::npos) << out;
  for (const char* command : {"prepare", "train", "generate", "chat", "serve", "bench"}) {
    EXPECT_NE(out.find(command), std::string::npos) << "the list lacks " << command << ": " << out;
  }
}

// The second of three lines is not UTF-8: chat says so on stderr, naming the line, and answers the third.
TEST(CliCommands, ChatSkipsALineThatIsNotUtf8) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  const uint64_t seed = testing::fresh_seed();
  const testing::TinyModelDir model(seed);
  const fs::path input = model.dir / "turns.txt";
  const char bad = static_cast<char>(0x80 + seed % 0x40);  // a continuation byte cannot start a character
  testing::write_text_file(input, std::string("Hello!\nbad ") + bad + " line\nAnd then?\n");
  std::string out;
  const int status = testing::run_command(bin.string() + " chat --model " + model.dir.string() +
                                              " --max-tokens 3 --temperature 0 --verbose < " + input.string(),
                                          out);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("[chat] line 2 is not UTF-8 (byte 5 of it"), std::string::npos) << out;
  EXPECT_EQ(testing::count_of(out, "[chat] prompt "), 2u) << "a reply to lines 1 and 3: " << out;
}

}  // namespace
}  // namespace microllm
