// `microllm template` as a script runs it: a tokenizer folder (tokenizer_config.json, chat_template.jinja) and
// a messages file in, exactly transformers' rendering out (the goldens of tests/fixtures/chat_templates); status
// 2 naming the line and construct for an unsupported template, 1 for what the template raises. The executable
// is $MICROLLM_BIN, else apps/microllm of this build; the tests skip, saying so, when it is not built.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "cli_testing.h"
#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

namespace fs = std::filesystem;

fs::path chat_fixtures() { return fs::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "chat_templates"; }

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string golden_text(const std::string& template_name, const std::string& conversation, bool generation_prompt) {
  for (const Json& line : read_json_lines(chat_fixtures() / "golden.jsonl")) {
    if (line["template"] == template_name && line["conversation"] == conversation &&
        line["add_generation_prompt"] == generation_prompt) {
      return line["text"];
    }
  }
  ADD_FAILURE() << "no golden rendering " << template_name << " / " << conversation;
  return "";
}

nlohmann::ordered_json conversation(const std::string& group, const std::string& name) {
  const auto all = nlohmann::ordered_json::parse(read_file(chat_fixtures() / "conversations.json"));
  for (const auto& c : all[group]) {
    if (c["name"] == name) return c;
  }
  ADD_FAILURE() << "no conversation " << name;
  return {};
}

class TemplateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(microllm_binary())) GTEST_SKIP() << microllm_binary() << " is not built (target microllm_app)";
    dir_ = fs::temp_directory_path() / ("microllm-template-cli-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tokenizer folder whose tokenizer_config.json carries `template_name`'s template and special tokens.
  void tokenizer_folder(const std::string& template_name, const Json& special_tokens) {
    Json config = special_tokens;
    config["chat_template"] = read_file(chat_fixtures() / "templates" / (template_name + ".jinja"));
    write(dir_ / "tokenizer_config.json", config.dump());
  }

  int run(const std::string& arguments, std::string& out) {
    return run_command(microllm_binary().string() + " template --model " + dir_.string() + " " + arguments, out);
  }

  fs::path dir_;
};

TEST_F(TemplateCli, PrintsTransformersRendering) {
  tokenizer_folder("qwen3", {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}});
  const auto thinking_off = conversation("thinking", "thinking_off");
  write(dir_ / "messages.json", thinking_off["messages"].dump());
  std::string out;
  EXPECT_EQ(
      run("--messages " + (dir_ / "messages.json").string() + " --add-generation-prompt --var enable_thinking=false",
          out),
      0)
      << out;
  EXPECT_EQ(out, golden_text("qwen3", "thinking_off", true));
  // Without the flag: transformers' default, no generation prompt.
  out.clear();
  EXPECT_EQ(run("--messages " + (dir_ / "messages.json").string() + " --var enable_thinking=false", out), 0) << out;
  EXPECT_EQ(out, golden_text("qwen3", "thinking_off", false));
}

TEST_F(TemplateCli, ToolsAndTheJinjaFileBesideTheConfig) {
  tokenizer_folder("llama3-instruct", {{"bos_token", "<|begin_of_text|>"}});
  // chat_template.jinja wins over tokenizer_config.json's template, as in newer Hub folders.
  write(dir_ / "chat_template.jinja", read_file(chat_fixtures() / "templates" / "qwen2.5-instruct.jinja"));
  const auto tools_user = conversation("tools", "tools_user");
  const auto tool_sets = nlohmann::ordered_json::parse(read_file(chat_fixtures() / "conversations.json"))["tool_sets"];
  write(dir_ / "messages.json", tools_user["messages"].dump());
  write(dir_ / "tools.json", tool_sets[tools_user["tools"].get<std::string>()].dump());
  std::string out;
  EXPECT_EQ(run("--messages " + (dir_ / "messages.json").string() + " --tools " + (dir_ / "tools.json").string() +
                    " --add-generation-prompt",
                out),
            0)
      << out;
  EXPECT_EQ(out, golden_text("qwen2.5-instruct", "tools_user", true));
}

TEST_F(TemplateCli, UnsupportedTemplatesExitWithStatus2) {
  write(dir_ / "chat_template.jinja", "{% for m in messages %}\n{{ m.content | wordwrap(5) }}{% endfor %}");
  write(dir_ / "messages.json", R"([{"role": "user", "content": "Hi"}])");
  std::string out;
  EXPECT_EQ(run("--messages " + (dir_ / "messages.json").string(), out), 2) << out;
  EXPECT_NE(out.find("line 2, column 16: the filter 'wordwrap' is not supported"), std::string::npos) << out;
  // What the template raises is an ordinary error (status 1), with its message.
  write(dir_ / "chat_template.jinja", "{{ raise_exception('System role not supported') }}");
  out.clear();
  EXPECT_EQ(run("--messages " + (dir_ / "messages.json").string(), out), 1) << out;
  EXPECT_NE(out.find("System role not supported"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run("--messages " + (dir_ / "messages.json").string() + " --var enable_thinking=maybe", out), 1) << out;
  EXPECT_NE(out.find("--var enable_thinking=maybe: the value is not JSON"), std::string::npos) << out;
}

}  // namespace
}  // namespace microllm::testing
