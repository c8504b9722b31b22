// A byte-level BPE tokenizer.json built in the test (the test's own reference, not the library's tables):
// the 256 byte characters of GPT-2's alphabet as ids 0..255, optional merges and added tokens. Shared by
// the tokenizer tests and the tiny model directories of the CLI and server tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace microllm::testing {

using Json = nlohmann::json;

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

inline Json added_token(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

}  // namespace microllm::testing
