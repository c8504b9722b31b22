#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "microllm/core/error.h"

namespace microllm::tokenizer_detail {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? str_cat("PCRE2 error ", code) : std::string(reinterpret_cast<const char*>(buffer));
}

// Per-thread match state: a one-pair match block, and a match context with a JIT stack large enough for
// long whitespace runs (the 32 KiB default overflows on `\s+(?!\S)` over a few thousand spaces).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);

  MatchScratch() {
    if (data == nullptr || context == nullptr) throw OutOfMemoryError("tokenizer", "cannot allocate PCRE2 match data");
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    // Bounds backtracking on a hostile pattern: a clear error instead of a hang.
    pcre2_set_match_limit(context, 100'000'000);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

constexpr const char* kSpace = "\\p{White_Space}";
constexpr const char* kNotSpace = "\\P{White_Space}";
constexpr const char* kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kHex = "0-9A-Fa-f";

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string translate_oniguruma_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E is literal: copy it untouched
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      i += 2;
      if (in_class) {
        if (e == 's')
          out += kSpace;
        else if (e == 'S')
          out += kNotSpace;
        else if (e == 'w')
          out += kWord;
        else if (e == 'h')
          out += kHex;
        else
          (out += '\\') += e;
      } else {
        if (e == 's')
          out += kSpace;
        else if (e == 'S')
          out += kNotSpace;
        else if (e == 'w')
          ((out += '[') += kWord) += ']';
        else if (e == 'W')
          ((out += "[^") += kWord) += ']';
        else if (e == 'h')
          ((out += '[') += kHex) += ']';
        else if (e == 'H')
          ((out += "[^") += kHex) += ']';
        else
          (out += '\\') += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

std::string escape_regex(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    // PCRE2 reads a backslash before any ASCII non-alphanumeric character as that character.
    const auto u = static_cast<unsigned char>(c);
    const bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_';
    if (u < 0x80 && !alnum) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern) : pattern_(pattern), code_(std::make_unique<Code>()) {
  const std::string translated = translate_oniguruma_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr);
  if (code_->code == nullptr) {
    throw ValueError("tokenizer", str_cat("bad regex '", pattern_, "': ", pcre2_message(error), " at offset ", offset));
  }
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // without JIT support the interpreter runs
}

Regex::~Regex() = default;

bool Regex::search(std::string_view text, size_t start, bool anchored, size_t& match_start, size_t& match_end) const {
  MatchScratch& s = scratch();
  const uint32_t options = PCRE2_NO_UTF_CHECK | (anchored ? PCRE2_ANCHORED : 0u);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, options,
                             s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    throw ValueError("tokenizer", str_cat("regex '", pattern_, "' failed on a text of ", text.size(),
                                          " bytes: ", pcre2_message(rc)));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
  match_start = ovector[0];
  match_end = ovector[1];
  return true;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  // The onig crate's FindMatches: an empty match right where the previous match ended is skipped by
  // moving one character on.
  std::vector<std::pair<size_t, size_t>> matches;
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    size_t s = 0, e = 0;
    if (!search(text, last_end, false, s, e)) break;
    if (s == e && have_last && last_match_end == e) {
      size_t step = 1;
      if (last_end < text.size()) {
        const auto lead = static_cast<unsigned char>(text[last_end]);
        step = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      }
      last_end += step;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    matches.emplace_back(s, e);
  }
  return matches;
}

std::string Regex::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  size_t copied = 0;
  for (const auto& [start, end] : find_all(text)) {
    out.append(text, copied, start - copied);
    out += content;
    copied = end;
  }
  out.append(text, copied, std::string_view::npos);
  return out;
}

bool Regex::matches_at(std::string_view text, size_t pos) const {
  size_t s = 0, e = 0;
  return search(text, pos, true, s, e);
}

}  // namespace microllm::tokenizer_detail
