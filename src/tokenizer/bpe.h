// The BPE model of Hugging Face tokenizers: a vocabulary, ranked merges, and per-word merging driven by a
// priority queue of candidate pairs (lowest rank first, then leftmost), so a word of n symbols costs
// O(n log n) rather than the O(n^2) of rescanning for the best pair after each merge. Words shorter than
// 256 bytes are cached (10 000 entries, as Hugging Face does).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/model.h"

namespace microllm::tokenizer_detail {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token (Llama 3)
};

class BpeModel final : public Model {
 public:
  // `where` prefixes the errors (a merge naming a token that is not in the vocabulary).
  // `merge_where(i)` names merge i in messages ("model.merges[12]").
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::function<std::string(size_t)>& merge_where);

  // Appends the ids of one pre-token (already in the model's alphabet, e.g. byte-level characters).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

  std::optional<int32_t> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int32_t id) const override;
  size_t vocab_size() const override { return vocab_.size(); }

 private:
  struct MergeValue {
    int32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  const MergeValue* find_merge(int32_t left, int32_t right) const;

  Vocab vocab_;
  std::unordered_map<int32_t, const std::string*> id_to_token_;
  std::unordered_map<uint64_t, MergeValue> merges_;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;

  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace microllm::tokenizer_detail
