// The microllm command end to end: builds a tiny random Qwen2-style model directory (model.safetensors,
// config.json, generation_config.json, a byte-level tokenizer.json with ChatML tokens, tokenizer_config.json
// and the Qwen2.5 chat template from the fixtures), then runs tests/generate/cli_smoke.sh over it:
// inspect, generate --model / --checkpoint / --chat / --stop, and chat with two piped turns.
// The microllm executable is $MICROLLM_BIN, else apps/microllm beside this test's build folder; the test
// skips, saying so, when it has not been built.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "microllm/models/loader.h"
#include "test_support.h"

namespace microllm {
namespace {

namespace fs = std::filesystem;

fs::path microllm_binary() {
  if (const char* bin = std::getenv("MICROLLM_BIN")) return bin;
  const fs::path self = fs::read_symlink("/proc/self/exe");  // <build>/tests/generate_tests
  return self.parent_path().parent_path() / "apps" / "microllm";
}

// GPT-2's byte-level alphabet: the character standing for byte b, JSON-escaped.
std::string byte_char_json(int b) {
  int shifted = 0, cp = b;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    if (x == b) {
      cp = printable ? x : 0x100 + shifted;
      break;
    }
    if (!printable) ++shifted;
  }
  if (cp == '"') return "\\\"";
  if (cp == '\\') return "\\\\";
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// A byte-level BPE tokenizer (ids 0..255, no merges) with <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258.
std::string tokenizer_json() {
  std::ostringstream vocab;
  for (int b = 0; b < 256; ++b) vocab << (b ? ", " : "") << "\"" << byte_char_json(b) << "\": " << b;
  auto added = [](int id, const char* content) {
    return std::string("{\"id\": ") + std::to_string(id) + ", \"content\": \"" + content +
           "\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}";
  };
  return std::string("{\"version\": \"1.0\", \"added_tokens\": [") + added(256, "<|endoftext|>") + ", " +
         added(257, "<|im_start|>") + ", " + added(258, "<|im_end|>") +
         "], \"normalizer\": null, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
         "\"use_regex\": true}, \"post_processor\": null, "
         "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true}, "
         "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
         "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": {" +
         vocab.str() + "}, \"merges\": []}}";
}

TEST(CliSmoke, InspectGenerateAndChatOnATinyModelDirectory) {
  const fs::path bin = microllm_binary();
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is not built (cmake --build ... --target microllm_app)";
  // Not __FILE__: under ccache's base_dir it is a path relative to where the compiler ran.
  const fs::path source = fs::path(MICROLLM_SOURCE_DIR) / "tests" / "generate";
  const fs::path script = source / "cli_smoke.sh";
  const fs::path chat_template = source.parent_path() / "fixtures" / "tokenizer" / "templates" / "qwen2.5-instruct.jinja";
  ASSERT_TRUE(fs::exists(script)) << script;
  ASSERT_TRUE(fs::exists(chat_template)) << chat_template;

  const uint64_t seed = testing::fresh_seed();
  const fs::path dir = fs::temp_directory_path() / ("microllm-cli-smoke-" + std::to_string(seed));
  fs::create_directories(dir);
  nn::TransformerConfig c;
  c.model_type = "qwen2";
  c.vocab_size = 272;  // the tokenizer's 259 tokens, padded as real models pad their tables
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.attention_bias = true;
  c.rope.theta = 1000000;
  c.max_position_embeddings = 512;
  c.eos_token_ids = {258};
  models::save_model(nn::TransformerLM(c, seed), dir.string());
  write_file(dir / "generation_config.json", R"({"eos_token_id": [258, 256], "do_sample": true, "top_k": 20})");
  write_file(dir / "tokenizer.json", tokenizer_json());
  write_file(dir / "tokenizer_config.json",
             R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"})");
  fs::copy_file(chat_template, dir / "chat_template.jinja", fs::copy_options::overwrite_existing);

  const std::string command = "bash '" + script.string() + "' '" + bin.string() + "' '" + dir.string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("all checks passed"), std::string::npos) << output;
  std::cout << output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace microllm
