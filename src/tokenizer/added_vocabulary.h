// Added tokens (tokenizer.json "added_tokens"): found in the text before pre-tokenization, longest match
// first at the leftmost position (Hugging Face's aho-corasick LeftmostLongest), with single_word, lstrip and
// rstrip applied as Hugging Face's AddedVocabulary::find_matches does. Tokens with normalized = false match
// the raw text; those with normalized = true match the normalized pieces in between.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace microllm::tokenizer_detail {

class Normalizer;

struct AddedTokenInfo {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A piece of the input: text still to pre-tokenize, or an added token found there.
struct Segment {
  std::string text;
  int32_t id = -1;             // >= 0: an added token
  bool at_text_start = false;  // begins the text (no added token before it)
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalizer` (may be null) normalizes the content of tokens with normalized = true.
  AddedVocabulary(std::vector<AddedTokenInfo> tokens, const Normalizer* normalizer);

  // Splits `text` at the added tokens, normalizing the pieces in between; empty pieces are dropped.
  std::vector<Segment> split(std::string_view text, const Normalizer* normalizer) const;

  const AddedTokenInfo* by_id(int32_t id) const;
  const AddedTokenInfo* by_content(std::string_view content) const;
  const std::vector<AddedTokenInfo>& tokens() const { return tokens_; }

 private:
  // Patterns of one matching pass, grouped by first byte and longest first.
  struct MatchingSet {
    std::array<std::vector<std::pair<std::string, size_t>>, 256> by_first_byte;  // (pattern, token index)
    bool empty = true;
  };
  void add_pattern(MatchingSet& set, std::string pattern, size_t index);
  // `text_at_start`: `text` begins the whole text, so a piece at its offset 0 does too.
  void find_matches(std::string_view text, bool text_at_start, const MatchingSet& set, std::vector<Segment>& out) const;

  std::vector<AddedTokenInfo> tokens_;
  std::unordered_map<int32_t, size_t> index_by_id_;
  std::unordered_map<std::string, size_t> index_by_content_;
  MatchingSet raw_;         // normalized = false
  MatchingSet normalized_;  // normalized = true, matched against normalized text
};

}  // namespace microllm::tokenizer_detail
