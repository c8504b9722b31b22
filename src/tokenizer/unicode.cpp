#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "microllm/core/error.h"
#include "tokenizer/regex.h"

namespace microllm::tokenizer_detail {

namespace {

// The second byte's range of a well-formed sequence depends on the lead byte (Unicode table 3-7).
bool second_byte_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

size_t expected_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// How many bytes from s[i] are a prefix of a well-formed sequence (at least 1 for an ill-formed lead),
// and whether the whole sequence is there.
struct Scan {
  size_t length;
  bool complete;
};

Scan scan(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t want = expected_length(lead);
  if (want == 0) return {1, false};
  if (want == 1) return {1, true};
  size_t got = 1;
  while (got < want && i + got < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + got]);
    const bool ok = got == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {got, false};
    ++got;
  }
  return {got, got == want};
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const Scan r = scan(s, i);
  return r.complete ? r.length : 0;
}

size_t utf8_first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan r = scan(s, i);
    if (!r.complete) return i;
    i += r.length;
  }
  return s.size();
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A sequence is at most 4 bytes: only a lead byte among the last 3 can start an incomplete one.
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    const auto lead = static_cast<unsigned char>(s[i]);
    if (expected_length(lead) < 2) continue;
    const Scan r = scan(s, i);
    if (!r.complete && i + r.length == s.size()) return s.size() - i;
  }
  return 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    const Scan r = scan(bytes, i);
    if (r.complete) {
      out.append(bytes.substr(i, r.length));
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal subpart
    }
    i += r.length;
  }
  return out;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t n = expected_length(b0);
  char32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string unicode_normalize(std::string_view s, NormalForm form) {
  if (s.empty()) return {};
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::nfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                   &result, static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  if (n < 0) throw ValueError("tokenizer", str_cat("Unicode normalization failed: ", utf8proc_errmsg(n)));
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<int32_t>(utf8_next(s, i)))));
  return out;
}

namespace {

bool matches_char(const Regex& re, char32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return re.matches_at(s, 0);
}

}  // namespace

bool is_rust_whitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  static const Regex re("\\p{White_Space}");
  return matches_char(re, cp);
}

bool is_rust_alphanumeric(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  static const Regex re("[\\p{Alphabetic}\\p{N}]");
  return matches_char(re, cp);
}

bool is_python_space(char32_t cp) {
  if (cp > 0x10FFFF) return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<int32_t>(cp));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

}  // namespace microllm::tokenizer_detail
