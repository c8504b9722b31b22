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

#include "byte_level_tokenizer.h"
#include "microllm/core/error.h"
#include "microllm/tokenizer/tokenizer.h"
#include "test_support.h"

namespace microllm::testing {

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

// The texts of fixture files (one JSON string per line), in order; texts.jsonl by default.
inline std::vector<std::string> fixture_texts(const std::vector<std::string>& files = {"texts.jsonl"}) {
  std::vector<std::string> texts;
  for (const std::string& file : files) {
    for (const Json& j : read_json_lines(tokenizer_fixtures() / file)) texts.push_back(j.get<std::string>());
  }
  return texts;
}

// decode() of `ids`, and the same ids through a StreamDecoder one at a time, each piece checked to be UTF-8.
struct StreamedDecode {
  std::string text;
  bool pieces_are_utf8 = true;
};
inline StreamedDecode stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special_tokens) {
  StreamedDecode result;
  StreamDecoder stream = tok.stream_decoder(skip_special_tokens);
  for (const int32_t id : ids) {
    const std::string piece = stream.push(id);
    result.pieces_are_utf8 = result.pieces_are_utf8 && first_invalid_utf8(piece) == piece.size();
    result.text += piece;
  }
  result.text += stream.finish();
  return result;
}

// A character-level BPE tokenizer.json over `vocab` (no pre-tokenizer unless set), for hand-checked cases.
inline Json char_level_json(const std::vector<std::string>& vocab_tokens, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  for (size_t i = 0; i < vocab_tokens.size(); ++i) vocab[vocab_tokens[i]] = static_cast<int>(i);
  Json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return {{"model", model}};
}

inline Tokenizer tokenizer_of(const Json& json) { return Tokenizer::from_json_text(json.dump(), "tokenizer.json"); }

}  // namespace microllm::testing
