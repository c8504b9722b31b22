#include "tokenizer/unigram.h"

#include <limits>

#include "microllm/core/error.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

constexpr double kUnknownPenalty = 10.0;  // Hugging Face's K_UNK_PENALTY

// The best path that ends at one byte offset of the word.
struct PathEnd {
  double score = 0;
  std::optional<size_t> starts_at;  // where its last piece starts; nullopt: not reached yet
  int32_t id = -1;                  // its last piece (the unknown id for an unknown character)
};

}  // namespace

UnigramModel::UnigramModel(std::vector<std::pair<std::string, double>> pieces, std::optional<int32_t> unk_id,
                           bool byte_fallback)
    : pieces_(std::move(pieces)),
      unk_id_(unk_id),
      byte_fallback_(byte_fallback),
      min_score_(std::numeric_limits<double>::infinity()) {
  ids_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const auto& [text, score] = pieces_[id];
    ids_.insert_or_assign(text, static_cast<int32_t>(id));
    min_score_ = std::min(min_score_, score);
    longest_piece_ = std::max(longest_piece_, text.size());
  }
}

std::optional<int32_t> UnigramModel::token_to_id(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* UnigramModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
  return &pieces_[static_cast<size_t>(id)].first;
}

std::vector<std::pair<size_t, size_t>> UnigramModel::segment(std::string_view word) const {
  const double unknown_score = min_score_ - kUnknownPenalty;
  std::vector<PathEnd> best(word.size() + 1);
  best[0].starts_at = 0;
  auto offer = [&](size_t start, size_t end, int32_t id, double score) {
    PathEnd& target = best[end];
    const double candidate = best[start].score + score;
    if (!target.starts_at || candidate > target.score) target = {candidate, start, id};
  };
  for (size_t start = 0; start < word.size();) {
    const size_t char_length = std::max<size_t>(1, utf8_sequence_length(word, start));
    bool single_character_piece = false;
    // Every piece that starts here (Hugging Face's trie common-prefix search), shortest first.
    for (size_t end = start + 1; end <= word.size() && end - start <= longest_piece_; ++end) {
      const auto it = ids_.find(word.substr(start, end - start));
      if (it == ids_.end()) continue;
      offer(start, end, it->second, pieces_[static_cast<size_t>(it->second)].second);
      single_character_piece = single_character_piece || end - start == char_length;
    }
    if (!single_character_piece) {
      if (!unk_id_) {
        throw ValueError("tokenizer", str_cat("the Unigram model has no piece for '", word.substr(start, char_length),
                                              "' and no unk_id"));
      }
      offer(start, start + char_length, *unk_id_, unknown_score);
    }
    start += char_length;
  }
  // Back from the end; adjacent unknown pieces become one (Hugging Face's fuse_unk, always on).
  std::vector<std::pair<size_t, size_t>> spans;
  bool previous_unknown = false;
  for (size_t end = word.size(); end > 0;) {
    const PathEnd& node = best[end];
    const size_t start = *node.starts_at;
    const bool unknown = unk_id_ && node.id == *unk_id_;
    if (unknown && previous_unknown)
      spans.back().first = start;
    else
      spans.emplace_back(start, end);
    previous_unknown = unknown;
    end = start;
  }
  return {spans.rbegin(), spans.rend()};
}

void UnigramModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  for (const auto& [start, end] : segment(word)) {
    const std::string_view piece = word.substr(start, end - start);
    if (const auto id = token_to_id(piece)) {
      out.push_back(*id);
      continue;
    }
    if (byte_fallback_ && append_byte_fallback(*this, piece, out)) continue;
    if (!unk_id_) throw ValueError("tokenizer", str_cat("the Unigram model has no unk_id for '", piece, "'"));
    out.push_back(*unk_id_);
  }
}

}  // namespace microllm::tokenizer_detail
