// Helpers of the tokenizer tests: fixture and data paths, JSON lines, and small tokenizer.json builders.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::testing {

using Json = nlohmann::json;

inline std::filesystem::path tokenizer_fixtures() {
  return std::filesystem::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer";
}

// data/tokenizers (scripts/fetch-tokenizers.sh), or $MICROLLM_TOKENIZERS_DIR.
inline std::filesystem::path tokenizers_data() {
  if (const char* dir = std::getenv("MICROLLM_TOKENIZERS_DIR")) return dir;
  return std::filesystem::path(MICROLLM_SOURCE_DIR) / "data" / "tokenizers";
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<Json> read_json_lines(const std::filesystem::path& path) {
  std::vector<Json> out;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(Json::parse(line));
  }
  return out;
}

inline std::vector<std::string> fixture_texts() {
  std::vector<std::string> texts;
  for (const Json& j : read_json_lines(tokenizer_fixtures() / "texts.jsonl")) texts.push_back(j.get<std::string>());
  return texts;
}

// GPT-2's byte-level alphabet, as the test's own reference (not the library's table).
inline std::string byte_char(int b) {
  int shifted = 0, cp = b;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    if (x == b) {
      cp = printable ? x : 0x100 + shifted;
      break;
    }
    if (!printable) ++shifted;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer.json: the 256 byte characters (ids 0..255), then the merged tokens in order.
// `merges` are pairs of byte-level strings ("Ġ" for a space).
inline Json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges, bool use_regex = true) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    merge_list.push_back(Json::array({a, b}));
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  return {{"version", "1.0"},
          {"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
          {"model", model}};
}

// A character-level BPE tokenizer.json over `vocab` (no pre-tokenizer unless set), for hand-checked cases.
inline Json char_level_json(const std::vector<std::string>& vocab_tokens, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  for (size_t i = 0; i < vocab_tokens.size(); ++i) vocab[vocab_tokens[i]] = static_cast<int>(i);
  Json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return {{"model", model}};
}

inline Json added_token(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

inline Tokenizer tokenizer_of(const Json& json) { return Tokenizer::from_json_text(json.dump(), "tokenizer.json"); }

// The message of the exception `fn` throws as ErrorType; fails the test if it throws nothing or another type.
template <typename ErrorType, typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const ErrorType& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

}  // namespace microllm::testing
