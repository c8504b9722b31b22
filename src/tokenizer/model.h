// The model of tokenizer.json ("model"): turns one pre-tokenized word into ids. BpeModel (bpe.h) and
// UnigramModel (unigram.h) are the two this library has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace microllm::tokenizer_detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-token (already in the model's alphabet).
  virtual void tokenize(std::string_view word, std::vector<int32_t>& out) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual const std::string* id_to_token(int32_t id) const = 0;
  virtual size_t vocab_size() const = 0;
};

// The id of `<0xNN>` for each byte of `text` appended to `out` (SentencePiece's byte fallback); false, and
// `out` unchanged, when one of those tokens is not in the vocabulary.
bool append_byte_fallback(const Model& model, std::string_view text, std::vector<int32_t>& out);

}  // namespace microllm::tokenizer_detail
