// Decoders of tokenizer.json ("decoder"): ByteLevel and Sequence, or none (tokens joined by spaces).
// Each turns one token into the bytes it contributes, so a decode is a concatenation and the streaming
// decoder can emit token by token; the final bytes become UTF-8 as Rust's from_utf8_lossy does.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_view.h"

namespace microllm::tokenizer_detail {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends what `token` contributes; `first` is whether it is the first token of the decode.
  virtual void append(std::string_view token, bool first, std::string& out) const = 0;
};

std::unique_ptr<Decoder> parse_decoder(const JsonView& json, int depth = 0);
std::unique_ptr<Decoder> make_byte_level_decoder();
std::unique_ptr<Decoder> make_join_decoder();  // no decoder: tokens joined by " "

}  // namespace microllm::tokenizer_detail
