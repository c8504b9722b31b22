// The microllm command itself: --version and -V, an unknown command (which lists the commands), and a chat
// session that meets a line that is not UTF-8 (reported, skipped, and the session goes on) on a tiny random
// model directory (tests/support/tiny_model_dir.h). The executable is $MICROLLM_BIN, else apps/microllm
// beside this test's build folder; the tests skip, saying so, when it has not been built.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_testing.h"
#include "microllm/models/loader.h"
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

// A folder of each tokenizer family (scripts/fetch-tokenizers.sh: byte-level BPE of Qwen, Llama 3, DeepSeek-V3 and
// o200k; SentencePiece-lineage BPE with byte fallback of Llama 2 and Gemma 3) with tiny random weights of its
// vocabulary's size and its own chat template (Llama 2 and o200k ship none: a fixture's) chats: exit 0 and a
// reply to each line. Skips the families whose files were not fetched.
TEST(CliCommands, ChatWithAFolderOfEachTokenizerFamily) {
  const fs::path bin = testing::microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  const fs::path fetched = testing::fetched_tokenizers();
  const fs::path templates = fs::path(MICROLLM_SOURCE_DIR) / "tests/fixtures/chat_templates/templates";
  const std::vector<std::pair<std::string, std::string>> families = {
      {"qwen3", ""},       {"llama3", ""},
      {"deepseek_v3", ""}, {"llama2", "llama2-chat.jinja"},
      {"gemma3", ""},      {"o200k", "qwen2.5-instruct.jinja"}};
  int chatted = 0;
  for (const auto& [family, fallback_template] : families) {
    SCOPED_TRACE(family);
    const fs::path source = fetched / family;
    if (!fs::exists(source / "tokenizer.json")) continue;
    const fs::path dir = fs::temp_directory_path() / ("microllm-chat-" + family + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(source / file, dir / file);
    if (!fallback_template.empty()) fs::copy_file(templates / fallback_template, dir / "chat_template.jinja");
    nn::TransformerConfig c;
    c.vocab_size = testing::largest_token_id(dir / "tokenizer.json") + 1;
    c.hidden_size = 16, c.intermediate_size = 32, c.num_layers = 1, c.num_heads = 2, c.num_kv_heads = 1;
    c.max_position_embeddings = 4096;
    models::save_model(nn::TransformerLM(c, testing::fresh_seed()), dir.string());
    const fs::path input = dir / "turns.txt";
    testing::write_text_file(input, "Hello, wörld!\nAnd then?\n");
    std::string out;
    const int status = testing::run_command(bin.string() + " chat --model " + dir.string() +
                                                " --max-tokens 3 --temperature 0 --verbose < " + input.string(),
                                            out);
    EXPECT_EQ(status, 0) << out;
    EXPECT_EQ(testing::count_of(out, "[chat] prompt "), 2u) << "a reply to each line: " << out;
    fs::remove_all(dir);
    ++chatted;
  }
  if (chatted == 0) GTEST_SKIP() << "no tokenizer folders in " << fetched << ": run scripts/fetch-tokenizers.sh";
}

}  // namespace
}  // namespace microllm
