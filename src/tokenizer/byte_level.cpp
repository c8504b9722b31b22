#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 0x144> to_byte;  // the mapped characters are all below U+0144

  Tables() {
    to_byte.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(0x100 + shifted++);
      utf8_append(to_char[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_level_char(uint8_t byte) { return tables().to_char[byte]; }

int byte_level_byte(char32_t cp) { return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (const char c : bytes) out += t.to_char[static_cast<uint8_t>(c)];
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const size_t mark = out.size();
  size_t i = 0;
  while (i < token.size()) {
    const int b = utf8_sequence_length(token, i) == 0 ? -1 : byte_level_byte(utf8_next(token, i));
    if (b < 0) {
      out.resize(mark);
      return false;
    }
    out.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace microllm::tokenizer_detail
