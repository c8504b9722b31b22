// A tiny random Qwen2-style model directory for tests of the commands and the server: model.safetensors +
// config.json (window 512 by default), generation_config.json, a byte-level tokenizer.json (ids 0..255, no
// merges) with <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258, tokenizer_config.json and the Qwen2.5
// chat template from the fixtures. The directory is removed on destruction. Needs MICROLLM_SOURCE_DIR.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "byte_level_tokenizer.h"
#include "microllm/models/loader.h"

namespace microllm::testing {

inline void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.good()) throw std::runtime_error("cannot write " + path.string());
}

// The tokenizer folders scripts/fetch-tokenizers.sh fetches: $MICROLLM_TOKENIZERS_DIR, else data/tokenizers.
inline std::filesystem::path fetched_tokenizers() {
  if (const char* dir = std::getenv("MICROLLM_TOKENIZERS_DIR")) return dir;
  return std::filesystem::path(MICROLLM_SOURCE_DIR) / "data" / "tokenizers";
}

// The largest token id of a tokenizer.json, its model's vocabulary and its added tokens.
inline int64_t largest_token_id(const std::filesystem::path& tokenizer_json) {
  std::ifstream in(tokenizer_json);
  const Json t = Json::parse(in);
  int64_t largest = 0;
  const Json& vocab = t["model"]["vocab"];
  if (vocab.is_object()) {
    for (const auto& [token, id] : vocab.items()) largest = std::max(largest, id.get<int64_t>());
  } else {  // Unigram: [piece, score] pairs, the id is the index
    largest = static_cast<int64_t>(vocab.size()) - 1;
  }
  for (const Json& added : t.value("added_tokens", Json::array()))
    largest = std::max(largest, added["id"].get<int64_t>());
  return largest;
}

struct TinyModelDir {
  std::filesystem::path dir;

  explicit TinyModelDir(uint64_t seed, int64_t window = 512,
                        const std::string& generation_config = R"({"eos_token_id": [258, 256], "do_sample": true})") {
    namespace fs = std::filesystem;
    const fs::path chat_template =
        fs::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer" / "templates" / "qwen2.5-instruct.jinja";
    dir =
        fs::temp_directory_path() / ("microllm-tiny-model-" + std::to_string(::getpid()) + "-" + std::to_string(seed));
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
    c.initializer_range = 0.2;  // well-separated logits: greedy choices do not hinge on rounding
    c.max_position_embeddings = window;
    c.eos_token_ids = {258};
    models::save_model(nn::TransformerLM(c, seed), dir.string());
    write_text_file(dir / "generation_config.json", generation_config);
    Json tokenizer = byte_level_json({});
    tokenizer["added_tokens"] = Json::array(
        {added_token(256, "<|endoftext|>"), added_token(257, "<|im_start|>"), added_token(258, "<|im_end|>")});
    write_text_file(dir / "tokenizer.json", tokenizer.dump());
    const Json tokenizer_config = {{"bos_token", nullptr},
                                   {"eos_token", "<|im_end|>"},
                                   {"pad_token", "<|endoftext|>"},
                                   {"tokenizer_class", "Qwen2Tokenizer"}};
    write_text_file(dir / "tokenizer_config.json", tokenizer_config.dump());
    fs::copy_file(chat_template, dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
  }
  ~TinyModelDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  TinyModelDir(const TinyModelDir&) = delete;
  TinyModelDir& operator=(const TinyModelDir&) = delete;
};

}  // namespace microllm::testing
