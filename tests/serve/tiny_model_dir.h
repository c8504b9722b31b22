// A tiny random Qwen2-style model directory for the serve tests, built as tests/generate/cli_smoke_test.cpp
// builds one: model.safetensors + config.json (window 512), generation_config.json, a byte-level
// tokenizer.json (ids 0..255, no merges) with <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258,
// tokenizer_config.json and the Qwen2.5 chat template from the fixtures. The directory is removed on destruction.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "microllm/models/loader.h"

namespace microllm::serve_testing {

namespace fs = std::filesystem;

// GPT-2's byte-level alphabet: the character standing for byte b, JSON-escaped.
inline std::string byte_char_json(int b) {
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

inline std::string tokenizer_json() {
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

inline void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.good()) throw std::runtime_error("cannot write " + path.string());
}

struct TinyModelDir {
  fs::path dir;
  explicit TinyModelDir(uint64_t seed, int64_t window = 512) {
    const fs::path chat_template =
        fs::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer" / "templates" / "qwen2.5-instruct.jinja";
    dir = fs::temp_directory_path() / ("microllm-serve-" + std::to_string(::getpid()) + "-" + std::to_string(seed));
    fs::create_directories(dir);
    nn::TransformerConfig c;
    c.model_type = "qwen2";
    c.vocab_size = 272;
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
    write_text_file(dir / "generation_config.json", R"({"eos_token_id": [258, 256], "do_sample": true})");
    write_text_file(dir / "tokenizer.json", tokenizer_json());
    write_text_file(dir / "tokenizer_config.json",
                    R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"})");
    fs::copy_file(chat_template, dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
  }
  ~TinyModelDir() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  TinyModelDir(const TinyModelDir&) = delete;
  TinyModelDir& operator=(const TinyModelDir&) = delete;
};

}  // namespace microllm::serve_testing
