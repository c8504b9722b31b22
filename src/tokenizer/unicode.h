// UTF-8 and Unicode helpers of the tokenizer: validation, lossy decoding (as Rust's from_utf8_lossy and
// Python's errors="replace"), normalization forms (utf8proc), and the character classes that Hugging Face
// tokenizers and Jinja use (Rust's char::is_whitespace / is_alphanumeric, Python's str.isspace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace microllm::tokenizer_detail {

// Length (1..4) of the well-formed UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view s, size_t i);

// Offset of the first byte that is not part of a well-formed UTF-8 sequence; s.size() if none.
size_t utf8_first_invalid(std::string_view s);

// Number of bytes at the end of `s` that begin a well-formed sequence but stop before its end (0..3):
// bytes a streaming decoder must hold back because the next token may complete them.
size_t utf8_incomplete_tail(std::string_view s);

// Well-formed UTF-8 from arbitrary bytes: each maximal ill-formed subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Decodes the code point at s[i] and advances i; s must be well-formed UTF-8.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
// `s` must be well-formed UTF-8.
std::string unicode_normalize(std::string_view s, NormalForm form);
// Simple (one code point to one code point) lowercase mapping.
std::string unicode_lowercase(std::string_view s);

// Rust char::is_whitespace (the White_Space property).
bool is_rust_whitespace(char32_t cp);
// Rust char::is_alphanumeric (Alphabetic or Numeric).
bool is_rust_alphanumeric(char32_t cp);
// Python str.isspace for one character: general category Zs, or bidirectional class WS, B or S.
bool is_python_space(char32_t cp);

}  // namespace microllm::tokenizer_detail
