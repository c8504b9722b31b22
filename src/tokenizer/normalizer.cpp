#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode_normalize(text, form_); }

 private:
  NormalForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = unicode_lowercase(text); }
};

// Removes leading and/or trailing White_Space characters.
class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!is_rust_whitespace(utf8_next(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t probe = start;
        if (!is_rust_whitespace(utf8_next(text, probe))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Replaces every match of a pattern (a literal String or a Regex) with `content`.
class Replace final : public Normalizer {
 public:
  Replace(std::string_view pattern, std::string content) : regex_(pattern), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = regex_.replace_all(text, content_); }

 private:
  Regex regex_;
  std::string content_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::string parse_pattern(const JsonView& json) {
  json.expect_object();
  if (const auto s = json.find("String")) return escape_regex(s->as_string());
  if (const auto r = json.find("Regex")) return r->as_string();
  json.fail("has neither 'String' nor 'Regex'");
}

std::unique_ptr<Normalizer> parse_normalizer(const JsonView& json, int depth) {
  if (depth > kMaxComponentDepth) json.fail("is nested too deeply");
  const std::string& type = json.at("type").as_string();
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::nfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::nfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::nfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::nfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip")
    return std::make_unique<Strip>(json.bool_or("strip_left", true), json.bool_or("strip_right", true));
  if (type == "Prepend") return std::make_unique<Prepend>(json.at("prepend").as_string());
  if (type == "Replace") {
    const JsonView pattern = json.at("pattern");
    try {
      return std::make_unique<Replace>(parse_pattern(pattern), json.at("content").as_string());
    } catch (const ValueError& e) {
      pattern.fail(bare_message(e));
    }
  }
  if (type == "Sequence") {
    const JsonView list = json.at("normalizers");
    list.expect_array();
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) parts.push_back(parse_normalizer(list.element(i), depth + 1));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw NotSupportedError("tokenizer", str_cat(json.where(), ".type: the normalizer '", type, "' is not supported"));
}

}  // namespace microllm::tokenizer_detail
