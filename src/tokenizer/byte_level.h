// GPT-2's byte-level alphabet: every byte is shown as one printable character, so a vocabulary of strings
// covers arbitrary bytes. Printable Latin-1 bytes stand for themselves; the other 68 bytes move, in
// order, to U+0100..U+0143 (the space 0x20 becomes U+0120 'Ġ', the newline 0x0A becomes U+010A 'Ċ').
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace microllm::tokenizer_detail {

// UTF-8 of the character that stands for `byte`.
const std::string& byte_level_char(uint8_t byte);
// The byte that `cp` stands for, or -1 when it is not in the alphabet.
int byte_level_byte(char32_t cp);
// Appends the byte-level spelling of `bytes` to `out`.
void byte_level_encode(std::string_view bytes, std::string& out);
// The bytes a byte-level token stands for; false (and `out` untouched) when some character is not in the
// alphabet (an added token such as "<｜User｜>"), in which case Hugging Face uses the token's own bytes.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace microllm::tokenizer_detail
