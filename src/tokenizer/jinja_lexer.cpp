// The Jinja lexer, with the whitespace control of jinja2's lexer as transformers configures it:
//   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` all whitespace after it;
//   - trim_blocks: the first newline after a block tag or a comment is removed (`+%}` keeps it);
//   - lstrip_blocks: spaces and tabs from the start of a line to a block tag or comment are removed
//     (`{%+` keeps them); not before `{{`.
// Newlines (\r\n, \r) become \n and one trailing newline of the source is dropped (keep_trailing_newline off).
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "microllm/core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/unicode.h"

namespace microllm::jinja {

namespace {

using tokenizer_detail::is_python_space;
using tokenizer_detail::utf8_append;
using tokenizer_detail::utf8_next;

// Python's \s and str.isspace() over one code point (ASCII control separators included).
bool is_space(char32_t cp) {
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || (cp >= 0x1c && cp <= 0x1f) || (cp > 0x7f && is_python_space(cp));
}

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t start = next_tag(pos);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      const char kind = src_[start + 1];
      const char sign =
          start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      std::string text = src_.substr(pos, start - pos);
      if (sign == '-') {
        text.resize(rstrip_length(text));
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_begin > 0 || line_starting) && line_begin < text.size() &&
            rstrip_length(std::string_view(text).substr(line_begin)) == 0) {
          text.resize(line_begin);
        }
      }
      emit_text(std::move(text), pos);
      size_t p = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string::npos) syntax_error(start, "missing end of comment tag '#}'");
        pos = after_end(close + 2, close > p ? src_[close - 1] : 0, /*block=*/true);
      } else if (kind == '%' && raw_begin(p, pos)) {
        // pos is past {% raw %}; the data runs to {% endraw %}.
        pos = raw_body(pos, start);
      } else {
        pos = tag(start, p, kind == '{');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{Token::Type::end, "", 0, 0, position(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Length of `text` without its trailing whitespace (Python's str.rstrip()).
  static size_t rstrip_length(std::string_view text) {
    size_t end = text.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t probe = start;
      if (!is_space(utf8_next(text, probe))) break;
      end = start;
    }
    return end;
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t next = p;
      if (!is_space(utf8_next(src_, next))) break;
      p = next;
    }
    return p;
  }

  // Past a closing delimiter that ends at `p`: `-` strips the whitespace after it, trim_blocks one newline.
  size_t after_end(size_t p, char sign, bool block) const {
    if (sign == '-') return skip_space(p);
    if (sign != '+' && block && p < src_.size() && src_[p] == '\n') return p + 1;
    return p;
  }

  // {% raw %} at `p` (just past "{%" and its sign): sets `after` past its end.
  bool raw_begin(size_t p, size_t& after) const {
    const size_t word = skip_space(p);
    if (src_.compare(word, 3, "raw") != 0) return false;
    size_t q = skip_space(word + 3);
    if (q < src_.size() && src_[q] == '-' && src_.compare(q + 1, 2, "%}") == 0) {
      after = skip_space(q + 3);
      return true;
    }
    if (src_.compare(q, 2, "%}") != 0) return false;
    after = q + 2;
    return true;
  }

  size_t raw_body(size_t from, size_t raw_start) {
    for (size_t i = src_.find("{%", from); i != std::string::npos; i = src_.find("{%", i + 2)) {
      const char sign = i + 2 < src_.size() && (src_[i + 2] == '-' || src_[i + 2] == '+') ? src_[i + 2] : 0;
      const size_t word = skip_space(i + 2 + (sign ? 1 : 0));
      if (src_.compare(word, 6, "endraw") != 0) continue;
      const size_t q = skip_space(word + 6);
      const char end_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      const size_t close = q + (end_sign ? 1 : 0);
      if (src_.compare(close, 2, "%}") != 0) continue;
      std::string text = src_.substr(from, i - from);
      if (sign == '-') {
        text.resize(rstrip_length(text));
      } else if (sign != '+') {
        const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_begin > 0 && rstrip_length(std::string_view(text).substr(line_begin)) == 0) text.resize(line_begin);
      }
      emit_text(std::move(text), from);
      return after_end(close + 2, end_sign, /*block=*/true);
    }
    syntax_error(raw_start, "missing end of raw directive '{% endraw %}'");
  }

  // The tokens of one {{ ... }} or {% ... %} tag; returns the position after it.
  size_t tag(size_t start, size_t p, bool variable) {
    tokens_.push_back(Token{variable ? Token::Type::variable_begin : Token::Type::block_begin, variable ? "{{" : "{%",
                            0, 0, position(start)});
    const char close = variable ? '}' : '%';
    std::vector<char> brackets;
    while (true) {
      p = skip_space(p);
      if (p >= src_.size()) syntax_error(start, variable ? "unclosed '{{'" : "unclosed '{%'");
      if (brackets.empty()) {
        for (const char sign : {'-', '+', '\0'}) {
          const size_t q = p + (sign ? 1 : 0);
          if ((sign == 0 || src_[p] == sign) && q + 1 < src_.size() + 1 &&
              src_.compare(q, 2, std::string{close, '}'}) == 0) {
            if (sign == '+' && variable) break;
            tokens_.push_back(Token{variable ? Token::Type::variable_end : Token::Type::block_end,
                                    variable ? "}}" : "%}", 0, 0, position(p)});
            return after_end(q + 2, sign, !variable);
          }
        }
      }
      p = token(p, brackets);
    }
  }

  size_t token(size_t p, std::vector<char>& brackets) {
    const char c = src_[p];
    const SourcePosition at = position(p);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      tokens_.push_back(Token{Token::Type::name, src_.substr(p, q - p), 0, 0, at});
      return q;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(p);
    if (c == '\'' || c == '"') return string(p);
    static constexpr std::string_view two_char[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const std::string_view op : two_char) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back(Token{Token::Type::operator_, std::string(op), 0, 0, at});
        return p + 2;
      }
    }
    if (std::string_view("+-*/%~[](){}<>=.:|,;").find(c) == std::string_view::npos) {
      syntax_error(p, str_cat("unexpected character '", std::string(1, c), "'"));
    }
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) syntax_error(p, str_cat("unexpected '", std::string(1, c), "'"));
      if (brackets.back() != c) {
        syntax_error(p,
                     str_cat("unexpected '", std::string(1, c), "', expected '", std::string(1, brackets.back()), "'"));
      }
      brackets.pop_back();
    }
    tokens_.push_back(Token{Token::Type::operator_, std::string(1, c), 0, 0, at});
    return p + 1;
  }

  // 42, 1_000, 3.14, 1e5, 2.5e-3 (Jinja's integer and float literals).
  size_t number(size_t p) {
    const SourcePosition at = position(p);
    auto digits = [&](size_t q) {
      while (q < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[q])) ||
              (src_[q] == '_' && q + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q + 1])))))
        ++q;
      return q;
    };
    size_t q = digits(p);
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      q = digits(q + 1);
      is_float = true;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t e = q + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        q = digits(e);
        is_float = true;
      }
    }
    std::string text = src_.substr(p, q - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token t{is_float ? Token::Type::floating : Token::Type::integer, text, 0, 0, at};
    if (is_float) {
      t.floating = std::strtod(text.c_str(), nullptr);  // as Python: tiny values denormal or 0, huge ones inf
    } else {
      errno = 0;
      t.integer = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        throw NotSupportedError("chat_template",
                                str_cat(where(p), "the integer ", text, " is beyond 64 bits and is not supported"));
      }
    }
    tokens_.push_back(std::move(t));
    return q;
  }

  // A quoted literal with Python's escapes (Jinja decodes them as "unicode-escape").
  size_t string(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) syntax_error(p, "unclosed string literal");
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) syntax_error(p, "unclosed string literal");
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (q + n > src_.size() || !std::all_of(src_.begin() + static_cast<std::ptrdiff_t>(q),
                                                  src_.begin() + static_cast<std::ptrdiff_t>(q + n), [](char h) {
                                                    return std::isxdigit(static_cast<unsigned char>(h)) != 0;
                                                  })) {
            syntax_error(q - 2, str_cat("truncated \\", std::string(1, e), " escape in a string literal"));
          }
          const unsigned long cp = std::stoul(src_.substr(q, n), nullptr, 16);
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            throw NotSupportedError("chat_template", str_cat(where(q - 2), "the escape \\", std::string(1, e),
                                                             src_.substr(q, n), " is not a Unicode scalar value"));
          }
          utf8_append(out, static_cast<char32_t>(cp));
          q += n;
          break;
        }
        case 'N':
          throw NotSupportedError("chat_template",
                                  str_cat(where(q - 2), "the \\N{...} escape (a character by name) is not supported"));
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            unsigned cp = static_cast<unsigned>(e - '0');
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k)
              cp = cp * 8 + static_cast<unsigned>(src_[q++] - '0');
            utf8_append(out, static_cast<char32_t>(cp));
          } else {  // Python keeps an unknown escape as it is
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{Token::Type::string, std::move(out), 0, 0, position(p)});
    return q + 1;
  }

  void emit_text(std::string text, size_t at) {
    if (!text.empty()) tokens_.push_back(Token{Token::Type::text, std::move(text), 0, 0, position(at)});
  }

  SourcePosition position(size_t offset) const {
    const auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    int column = 1;
    for (size_t i = *line; i < offset && i < src_.size(); ++i) {
      if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) ++column;
    }
    return {static_cast<int>(line - line_starts_.begin()) + 1, column};
  }

  std::string where(size_t offset) const {
    const SourcePosition p = position(offset);
    return str_cat("line ", p.line, ", column ", p.column, ": ");
  }

  [[noreturn]] void syntax_error(size_t offset, const std::string& message) const {
    throw ParseError("chat_template", where(offset) + message);
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  if (tokenizer_detail::utf8_first_invalid(source) != source.size()) {
    throw ParseError("chat_template", "the template is not valid UTF-8");
  }
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace microllm::jinja
