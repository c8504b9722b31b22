#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

char32_t last_char(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return utf8_next(s, start);
}

bool ends_with_word(std::string_view s) { return !s.empty() && is_rust_alphanumeric(last_char(s)); }

bool starts_with_word(std::string_view s) {
  size_t i = 0;
  return !s.empty() && is_rust_alphanumeric(utf8_next(s, i));
}

// Offset just after the last non-whitespace character of `s` (0 if all whitespace).
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!is_rust_whitespace(utf8_next(s, probe))) return end;
    end = start;
  }
  return 0;
}

// Offset of the first non-whitespace character of `s` (s.size() if all whitespace).
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!is_rust_whitespace(utf8_next(s, next))) return i;
    i = next;
  }
  return s.size();
}

}  // namespace

AddedVocabulary::AddedVocabulary(std::vector<AddedTokenInfo> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedTokenInfo& t = tokens_[i];
    index_by_id_[t.id] = i;
    index_by_content_[t.content] = i;  // a repeated content keeps the last entry
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedTokenInfo& t = tokens_[i];
    if (t.content.empty() || index_by_content_[t.content] != i) continue;
    if (t.normalized) {
      std::string pattern = t.content;
      if (normalizer != nullptr) normalizer->normalize(pattern);
      add_pattern(normalized_, std::move(pattern), i);
    } else {
      add_pattern(raw_, t.content, i);
    }
  }
  for (MatchingSet* set : {&raw_, &normalized_}) {
    for (auto& list : set->by_first_byte) {
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    }
  }
}

void AddedVocabulary::add_pattern(MatchingSet& set, std::string pattern, size_t index) {
  if (pattern.empty()) return;
  auto& list = set.by_first_byte[static_cast<uint8_t>(pattern[0])];
  for (const auto& existing : list) {
    if (existing.first == pattern) return;  // the first token with this pattern wins
  }
  list.emplace_back(std::move(pattern), index);
  set.empty = false;
}

const AddedTokenInfo* AddedVocabulary::by_id(int32_t id) const {
  const auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedTokenInfo* AddedVocabulary::by_content(std::string_view content) const {
  const auto it = index_by_content_.find(std::string(content));
  return it == index_by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocabulary::find_matches(std::string_view text, bool text_at_start, const MatchingSet& set,
                                   std::vector<Segment>& out) const {
  // Hugging Face's find_matches: spans between matches stay text; a match takes the token's id, widened
  // over surrounding whitespace by lstrip/rstrip, and dropped if single_word and inside a word.
  size_t start_offset = 0;
  size_t pos = 0;
  auto push = [&](size_t begin, size_t end, int32_t id) {
    if (end > begin) out.push_back({std::string(text.substr(begin, end - begin)), id, text_at_start && begin == 0});
  };
  while (!set.empty && pos < text.size()) {
    // Leftmost position with a match, longest pattern there.
    const std::pair<std::string, size_t>* found = nullptr;
    for (; pos < text.size(); ++pos) {
      for (const auto& candidate : set.by_first_byte[static_cast<uint8_t>(text[pos])]) {
        if (text.compare(pos, candidate.first.size(), candidate.first) == 0) {
          found = &candidate;
          break;
        }
      }
      if (found != nullptr) break;
    }
    if (found == nullptr) break;
    size_t start = pos, stop = pos + found->first.size();
    pos = stop;  // matches do not overlap
    const AddedTokenInfo& token = tokens_[found->second];
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(space_leftmost_at_end(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += space_rightmost_at_start(text.substr(stop));
    if (start_offset < start) push(start_offset, start, -1);
    out.push_back({std::string(text.substr(start, stop - start)), token.id, text_at_start && start == 0});
    start_offset = stop;
  }
  if (start_offset < text.size()) push(start_offset, text.size(), -1);
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, const Normalizer* normalizer) const {
  std::vector<Segment> raw;
  find_matches(text, true, raw_, raw);
  std::vector<Segment> out;
  out.reserve(raw.size());
  for (Segment& s : raw) {
    if (s.id >= 0) {
      out.push_back(std::move(s));
      continue;
    }
    if (normalizer != nullptr) normalizer->normalize(s.text);
    if (normalized_.empty) {
      if (!s.text.empty()) out.push_back(std::move(s));
    } else {
      find_matches(s.text, s.at_text_start, normalized_, out);
    }
  }
  return out;
}

}  // namespace microllm::tokenizer_detail
