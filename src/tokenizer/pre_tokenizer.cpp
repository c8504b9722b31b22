#include "tokenizer/pre_tokenizer.h"

#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

using Span = std::pair<size_t, size_t>;

// Hugging Face's NormalizedString::split: `matches` cover the text in order, each flagged as a match of
// the pattern or not; the behavior decides what becomes of the matches.
std::vector<Span> apply_behavior(const std::vector<std::pair<Span, bool>>& matches, Behavior behavior) {
  std::vector<Span> out;
  switch (behavior) {
    case Behavior::removed:
      for (const auto& [span, is_match] : matches) {
        if (!is_match) out.push_back(span);
      }
      break;
    case Behavior::isolated:
      for (const auto& m : matches) out.push_back(m.first);
      break;
    case Behavior::merged_with_previous: {
      bool previous_match = false;
      for (const auto& [span, is_match] : matches) {
        if (is_match && !previous_match && !out.empty())
          out.back().second = span.second;
        else
          out.push_back(span);
        previous_match = is_match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool previous_match = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->second && !previous_match && !out.empty())
          out.back().first = it->first.first;
        else
          out.push_back(it->first);
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::contiguous: {
      bool previous_match = false;
      for (const auto& [span, is_match] : matches) {
        if (is_match == previous_match && !out.empty())
          out.back().second = span.second;
        else
          out.push_back(span);
        previous_match = is_match;
      }
      break;
    }
  }
  return out;
}

// The text cut at the matches of `regex` (Hugging Face's Pattern::find_matches for a regex).
std::vector<std::pair<Span, bool>> regex_matches(const Regex& regex, std::string_view text, bool invert) {
  std::vector<std::pair<Span, bool>> out;
  if (text.empty()) {
    out.push_back({{0, 0}, invert});
    return out;
  }
  size_t previous = 0;
  for (const auto& [start, end] : regex.find_all(text)) {
    if (previous != start) out.push_back({{previous, start}, invert});
    out.push_back({{start, end}, !invert});
    previous = end;
  }
  if (previous != text.size()) out.push_back({{previous, text.size()}, invert});
  return out;
}

// Hugging Face's Pattern for a `char -> bool` function: every matching character is its own match.
template <typename Predicate>
std::vector<std::pair<Span, bool>> char_matches(std::string_view text, Predicate&& predicate) {
  std::vector<std::pair<Span, bool>> out;
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  size_t last_offset = 0, i = 0;
  while (i < text.size()) {
    const size_t start = i;
    const char32_t c = utf8_next(text, i);
    if (predicate(c)) {
      if (last_offset < start) out.push_back({{last_offset, start}, false});
      out.push_back({{start, i}, true});
      last_offset = i;
    }
  }
  if (text.size() > last_offset) out.push_back({{last_offset, text.size()}, false});
  return out;
}

void split_pieces(std::vector<PreToken>& pieces, Behavior behavior,
                  const std::function<std::vector<std::pair<Span, bool>>(std::string_view)>& find) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  for (const PreToken& piece : pieces) {
    for (const auto& [start, end] : apply_behavior(find(piece.text), behavior)) {
      if (end > start) out.push_back({piece.text.substr(start, end - start), piece.at_text_start && start == 0});
    }
  }
  pieces = std::move(out);
}

class Split final : public PreTokenizer {
 public:
  Split(std::string_view pattern, Behavior behavior, bool invert)
      : regex_(pattern), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, behavior_, [this](std::string_view t) { return regex_matches(regex_, t, invert_); });
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    if (regex_) {
      split_pieces(pieces, Behavior::isolated, [this](std::string_view t) { return regex_matches(*regex_, t, false); });
    }
    for (PreToken& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      byte_level_encode(p.text, mapped);
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual), numeric_("\\p{N}") {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, individual_ ? Behavior::isolated : Behavior::contiguous, [this](std::string_view t) {
      return char_matches(t, [this](char32_t c) {
        std::string s;
        utf8_append(s, c);
        return numeric_.matches_at(s, 0);
      });
    });
  }

 private:
  bool individual_;
  Regex numeric_;
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, Behavior::removed, [](std::string_view t) { return char_matches(t, is_rust_whitespace); });
  }
};

// SentencePiece's convention: every space becomes the replacement character ("▁"), one is put in front of
// the piece (always, or only at the start of the text), and with `split` the piece is cut before each one.
class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(MetaspaceOptions options) : options_(std::move(options)) {
    size_t i = 0;
    replacement_char_ = utf8_next(options_.replacement, i);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (PreToken& p : pieces) {
      std::string replaced;
      replaced.reserve(p.text.size() + 3 * 4);
      for (const char c : p.text) {
        if (c == ' ')
          replaced += options_.replacement;
        else
          replaced += c;
      }
      const bool prepend = !replaced.empty() && replaced.rfind(options_.replacement, 0) != 0 &&
                           (options_.prepend_scheme == PrependScheme::always ||
                            (options_.prepend_scheme == PrependScheme::first && p.at_text_start));
      if (prepend) replaced.insert(0, options_.replacement);
      p.text = std::move(replaced);
    }
    if (options_.split) {
      split_pieces(pieces, Behavior::merged_with_next, [this](std::string_view t) {
        return char_matches(t, [this](char32_t c) { return c == replacement_char_; });
      });
    }
  }

 private:
  MetaspaceOptions options_;
  char32_t replacement_char_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Behavior parse_behavior(const JsonView& json) {
  const std::string& name = json.as_string();
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  json.fail(str_cat("is not a split behavior ('", name,
                    "'; expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)"));
}

}  // namespace

MetaspaceOptions parse_metaspace_options(const JsonView& json) {
  MetaspaceOptions options;
  const JsonView replacement = json.at("replacement");
  options.replacement = replacement.as_string();
  if (options.replacement.empty() || utf8_sequence_length(options.replacement, 0) != options.replacement.size())
    replacement.fail(str_cat("is not one character ('", options.replacement, "')"));
  if (const auto scheme = json.find("prepend_scheme")) {
    const std::string& name = scheme->as_string();
    if (name == "first")
      options.prepend_scheme = PrependScheme::first;
    else if (name == "always")
      options.prepend_scheme = PrependScheme::always;
    else if (name == "never")
      options.prepend_scheme = PrependScheme::never;
    else
      scheme->fail(str_cat("is not a prepend scheme ('", name, "'; expected first, always or never)"));
  }
  if (!json.bool_or("add_prefix_space", true)) {
    if (options.prepend_scheme != PrependScheme::never)
      json.fail("has add_prefix_space false but a prepend_scheme other than 'never' (Hugging Face refuses it)");
  }
  options.split = json.bool_or("split", true);
  return options;
}

std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex) {
  return std::make_unique<ByteLevel>(add_prefix_space, use_regex);
}

std::unique_ptr<PreTokenizer> make_qwen2_pre_tokenizer() {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  parts.push_back(std::make_unique<Split>(kQwen2Pattern, Behavior::isolated, false));
  parts.push_back(std::make_unique<ByteLevel>(false, false));
  return std::make_unique<Sequence>(std::move(parts));
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonView& json, int depth) {
  if (depth > kMaxComponentDepth) json.fail("is nested too deeply");
  const std::string& type = json.at("type").as_string();
  if (type == "Split") {
    const JsonView pattern = json.at("pattern");
    const Behavior behavior = parse_behavior(json.at("behavior"));
    const bool invert = json.bool_or("invert", false);
    try {
      return std::make_unique<Split>(parse_pattern(pattern), behavior, invert);
    } catch (const ValueError& e) {
      pattern.fail(bare_message(e));
    }
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(json.bool_or("add_prefix_space", true), json.bool_or("use_regex", true));
  }
  if (type == "Metaspace") return std::make_unique<Metaspace>(parse_metaspace_options(json));
  if (type == "Digits") return std::make_unique<Digits>(json.bool_or("individual_digits", false));
  if (type == "Whitespace") {
    return std::make_unique<Split>(R"(\w+|[^\w\s]+)", Behavior::removed, true);
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Sequence") {
    const JsonView list = json.at("pretokenizers");
    list.expect_array();
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) parts.push_back(parse_pre_tokenizer(list.element(i), depth + 1));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw NotSupportedError("tokenizer", str_cat(json.where(), ".type: the pre-tokenizer '", type, "' is not supported"));
}

}  // namespace microllm::tokenizer_detail
