// The Unigram model of Hugging Face tokenizers (SentencePiece's unigram language model): every piece has a
// log-probability score, and a word becomes the segmentation with the highest total score (a Viterbi pass
// over the word's characters, as Unigram::encode_optimized does). A character that starts no piece of its
// own becomes <unk> with the lowest score less 10, runs of them one <unk>; with byte_fallback a piece that
// is not in the vocabulary becomes its <0xNN> byte tokens instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/model.h"

namespace microllm::tokenizer_detail {

class UnigramModel final : public Model {
 public:
  // `pieces`: (text, score) in id order. `unk_id` must be below pieces.size() (checked by the loader).
  UnigramModel(std::vector<std::pair<std::string, double>> pieces, std::optional<int32_t> unk_id, bool byte_fallback);

  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int32_t id) const override;
  size_t vocab_size() const override { return pieces_.size(); }

 private:
  // The best segmentation of `word` as byte ranges, unknown characters fused ([start, end) each).
  std::vector<std::pair<size_t, size_t>> segment(std::string_view word) const;

  std::vector<std::pair<std::string, double>> pieces_;
  Vocab ids_;  // a repeated piece maps to its last id, as Hugging Face's token_to_ids
  std::optional<int32_t> unk_id_;
  bool byte_fallback_;
  double min_score_;
  size_t longest_piece_ = 0;  // bytes
};

}  // namespace microllm::tokenizer_detail
