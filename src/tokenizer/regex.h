// A compiled PCRE2 pattern (UTF + UCP, JIT when available) with the matching semantics of the Oniguruma
// regexes that Hugging Face tokenizers uses: \s, \S and \w mean what they mean in Oniguruma (White_Space;
// letters, marks, decimal digits and connector punctuation), and find_all() steps over empty matches the
// way the onig crate's find_iter does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace microllm::tokenizer_detail {

class Regex {
 public:
  // Throws ValueError("[tokenizer] bad regex ...: <PCRE2 message> at offset N").
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match as [start, end) byte offsets. `text` must be well-formed UTF-8 (the caller checks once).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // `text` with every match replaced by `content` (a literal, no group references).
  std::string replace_all(std::string_view text, std::string_view content) const;
  // Whether the pattern matches starting exactly at byte `pos`.
  bool matches_at(std::string_view text, size_t pos) const;
  const std::string& pattern() const { return pattern_; }

 private:
  // Returns false when there is no match at or after `start`.
  bool search(std::string_view text, size_t start, bool anchored, size_t& match_start, size_t& match_end) const;

  std::string pattern_;
  struct Code;
  std::unique_ptr<Code> code_;
};

// Rewrites the Oniguruma escapes whose PCRE2 meaning differs (\s \S \w \W \h \H) into explicit classes.
std::string translate_oniguruma_pattern(std::string_view pattern);

// A pattern that matches `literal` exactly.
std::string escape_regex(std::string_view literal);

}  // namespace microllm::tokenizer_detail
