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

inline std::vector<std::string> fixture_texts() {
  std::vector<std::string> texts;
  for (const Json& j : read_json_lines(tokenizer_fixtures() / "texts.jsonl")) texts.push_back(j.get<std::string>());
  return texts;
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
