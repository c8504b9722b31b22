// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence, or none (tokens joined by " "). Each is Hugging Face's decode_chain run as a stream: a decode
// opens a DecodeStream, puts the tokens in one at a time and finishes it. Every stage passes on at once
// what later tokens cannot change and holds back only what they can (a run of <0xNN> byte tokens, trailing
// characters that Strip may remove), so a whole decode and a streaming one are the same code and the pieces
// of a stream add up to the decode exactly.
//
// Fuse and ByteLevel join all tokens into one; the stages after them receive that one token in pieces. The
// stages whose result there would depend on seeing the whole joined text at once (ByteFallback, ByteLevel, a
// Replace of more than one character, anything after ByteLevel's bytes) are refused with a
// NotSupportedError naming the decoder, rather than decoded differently from Hugging Face.
//
// The output is bytes: ByteLevel's may split a character across tokens, and the caller turns them into
// UTF-8 as Rust's from_utf8_lossy does. The other decoders put out UTF-8.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_view.h"

namespace microllm::tokenizer_detail {

// One decode in progress.
class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  // Puts in the next token and appends to `out` what can already be told.
  virtual void put(std::string_view token, std::string& out) = 0;
  // No more tokens: appends what was held back.
  virtual void finish(std::string& out) = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // A fresh decode whose output goes to `next` (another stage of a Sequence), or to `out` when null.
  // `next` must outlive the stream.
  virtual std::unique_ptr<DecodeStream> open(DecodeStream* next = nullptr) const = 0;
};

std::unique_ptr<Decoder> parse_decoder(const JsonView& json);
std::unique_ptr<Decoder> make_byte_level_decoder();
std::unique_ptr<Decoder> make_join_decoder();  // no decoder: tokens joined by " "

// Whether `token` is a byte-fallback token "<0xNN>", and its byte (Hugging Face's test, which also takes a
// lowercase or '+'-signed hex pair as Rust's u8::from_str_radix does).
bool parse_byte_token(std::string_view token, unsigned char& byte);

}  // namespace microllm::tokenizer_detail
