// Normalizers of tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace
// and Sequence. Others are a NotSupportedError naming the type and the field.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/json_view.h"

namespace microllm::tokenizer_detail {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is well-formed UTF-8 and stays so.
  virtual void normalize(std::string& text) const = 0;
};

// `depth` bounds the nesting of Sequence (a hostile file must not exhaust the stack).
std::unique_ptr<Normalizer> parse_normalizer(const JsonView& json, int depth = 0);

constexpr int kMaxComponentDepth = 32;

// A Split/Replace "pattern" ({"String": "..."} or {"Regex": "..."}) as a PCRE2 pattern for Regex.
std::string parse_pattern(const JsonView& json);

}  // namespace microllm::tokenizer_detail
