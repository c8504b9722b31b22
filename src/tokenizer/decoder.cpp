#include "tokenizer/decoder.h"

#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

const char* const kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// What a stage receives: separate tokens, or after Fuse/ByteLevel the pieces of one joined token (UTF-8
// text after Fuse, bytes after ByteLevel).
enum class Input { tokens, joined_text, joined_bytes };

// A stage of a decode: passes its output to the next stage, or appends it to the output.
class Stage : public DecodeStream {
 public:
  explicit Stage(DecodeStream* next) : next_(next) {}
  void finish(std::string& out) override { finish_next(out); }

 protected:
  void emit(std::string_view piece, std::string& out) {
    if (next_ != nullptr)
      next_->put(piece, out);
    else
      out.append(piece);
  }
  void finish_next(std::string& out) {
    if (next_ != nullptr) next_->finish(out);
  }

 private:
  DecodeStream* next_;
};

// A decoder whose stream is one Stage type built from the decoder's settings.
template <typename StageType, typename Settings>
class StageDecoder final : public Decoder {
 public:
  explicit StageDecoder(Settings settings) : settings_(std::move(settings)) {}
  std::unique_ptr<DecodeStream> open(DecodeStream* next) const override {
    return std::make_unique<StageType>(next, settings_);
  }

 private:
  Settings settings_;
};

struct NoSettings {};

// ByteLevel: each token's characters back to the bytes they stand for; a token with a character outside the
// byte alphabet (an added token) contributes its own bytes. Joins: the output is one run of bytes.
class ByteLevelStage final : public Stage {
 public:
  ByteLevelStage(DecodeStream* next, NoSettings) : Stage(next) {}
  void put(std::string_view token, std::string& out) override {
    bytes_.clear();
    if (!byte_level_decode(token, bytes_)) bytes_.assign(token);
    emit(bytes_, out);
  }

 private:
  std::string bytes_;
};

// No decoder: the tokens joined by spaces.
class JoinStage final : public Stage {
 public:
  JoinStage(DecodeStream* next, NoSettings) : Stage(next) {}
  void put(std::string_view token, std::string& out) override {
    if (!first_) emit(" ", out);
    emit(token, out);
    first_ = false;
  }

 private:
  bool first_ = true;
};

// Fuse: all tokens become one; the stages after it see its pieces.
class FuseStage final : public Stage {
 public:
  FuseStage(DecodeStream* next, NoSettings) : Stage(next) {}
  void put(std::string_view token, std::string& out) override { emit(token, out); }
};

// ByteFallback: a run of <0xNN> tokens becomes the text of its bytes when they are UTF-8 as a whole, else
// one U+FFFD per byte token; the run is held until a token that is not a byte ends it.
class ByteFallbackStage final : public Stage {
 public:
  ByteFallbackStage(DecodeStream* next, NoSettings) : Stage(next) {}
  void put(std::string_view token, std::string& out) override {
    unsigned char byte = 0;
    if (parse_byte_token(token, byte)) {
      run_ += static_cast<char>(byte);
      return;
    }
    flush(out);
    emit(token, out);
  }
  void finish(std::string& out) override {
    flush(out);
    finish_next(out);
  }

 private:
  void flush(std::string& out) {
    if (run_.empty()) return;
    if (utf8_first_invalid(run_) == run_.size()) {
      emit(run_, out);
    } else {
      for (size_t i = 0; i < run_.size(); ++i) emit(kReplacementCharacter, out);
    }
    run_.clear();
  }
  std::string run_;
};

// Replace: every match of a pattern in a token becomes `content` (after Fuse only one-character patterns,
// which cannot straddle two pieces, are accepted).
struct ReplaceSettings {
  std::shared_ptr<const Regex> regex;
  std::string content;
};
class ReplaceStage final : public Stage {
 public:
  ReplaceStage(DecodeStream* next, const ReplaceSettings& settings) : Stage(next), settings_(settings) {}
  void put(std::string_view token, std::string& out) override {
    emit(settings_.regex->replace_all(token, settings_.content), out);
  }

 private:
  const ReplaceSettings& settings_;
};

// Metaspace: the replacement character back to a space, except in the first token, where it is dropped
// (unless prepend_scheme is "never"). After Fuse there is only one token, the first.
struct MetaspaceSettings {
  MetaspaceOptions options;
  bool joined = false;
};
class MetaspaceStage final : public Stage {
 public:
  MetaspaceStage(DecodeStream* next, const MetaspaceSettings& settings) : Stage(next), settings_(settings) {}
  void put(std::string_view token, std::string& out) override {
    const bool drop = first_ && settings_.options.prepend_scheme != PrependScheme::never;
    const std::string& replacement = settings_.options.replacement;
    text_.clear();
    for (size_t i = 0; i < token.size();) {
      if (token.compare(i, replacement.size(), replacement) == 0) {
        if (!drop) text_ += ' ';
        i += replacement.size();
      } else {
        text_ += token[i++];
      }
    }
    emit(text_, out);
    if (!settings_.joined) first_ = false;
  }

 private:
  const MetaspaceSettings& settings_;
  bool first_ = true;
  std::string text_;
};

// Strip: drops up to `start` leading and up to `stop` trailing `content` characters of each token (of the
// whole text after Fuse). Trailing ones are held until a different character shows they are not trailing.
struct StripSettings {
  std::string content;  // one character
  size_t start = 0;
  size_t stop = 0;
  bool joined = false;
};
class StripStage final : public Stage {
 public:
  StripStage(DecodeStream* next, const StripSettings& settings) : Stage(next), settings_(settings) { reset(); }
  void put(std::string_view token, std::string& out) override {
    text_.clear();
    strip(token, text_);
    if (!settings_.joined) {
      end_token(text_);
      reset();
    }
    emit(text_, out);
  }
  void finish(std::string& out) override {
    if (settings_.joined) {
      text_.clear();
      end_token(text_);
      emit(text_, out);
    }
    finish_next(out);
  }

 private:
  void reset() {
    leading_left_ = settings_.start;
    held_ = 0;
  }
  void strip(std::string_view piece, std::string& text) {
    const std::string& content = settings_.content;
    for (size_t i = 0; i < piece.size();) {
      const size_t length = std::max<size_t>(1, utf8_sequence_length(piece, i));
      const bool is_content = piece.compare(i, length, content) == 0;
      if (leading_left_ > 0 && is_content) {
        --leading_left_;  // a leading one: dropped
      } else if (settings_.stop > 0 && is_content) {
        leading_left_ = 0;
        ++held_;  // maybe trailing
      } else {
        leading_left_ = 0;
        for (; held_ > 0; --held_) text += content;
        text.append(piece, i, length);
      }
      i += length;
    }
  }
  void end_token(std::string& text) {
    for (size_t n = held_ - std::min(held_, settings_.stop); n > 0; --n) text += settings_.content;
    held_ = 0;
  }

  const StripSettings& settings_;
  size_t leading_left_ = 0;
  size_t held_ = 0;  // trailing content characters not yet emitted
  std::string text_;
};

// Sequence: the stages chained, each feeding the next; with no stages, tokens pass through unchanged.
class SequenceStream final : public Stage {
 public:
  SequenceStream(std::vector<std::unique_ptr<DecodeStream>> stages, DecodeStream* next)
      : Stage(next), stages_(std::move(stages)) {}
  void put(std::string_view token, std::string& out) override {
    if (stages_.empty())
      emit(token, out);
    else
      stages_.front()->put(token, out);
  }
  void finish(std::string& out) override {
    if (stages_.empty())
      finish_next(out);
    else
      stages_.front()->finish(out);  // the last stage finishes `next`
  }

 private:
  std::vector<std::unique_ptr<DecodeStream>> stages_;  // stages_[i] feeds stages_[i + 1]
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::unique_ptr<DecodeStream> open(DecodeStream* next) const override {
    std::vector<std::unique_ptr<DecodeStream>> stages(parts_.size());
    for (size_t i = parts_.size(); i-- > 0;)
      stages[i] = parts_[i]->open(i + 1 < parts_.size() ? stages[i + 1].get() : next);
    return std::make_unique<SequenceStream>(std::move(stages), next);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

[[noreturn]] void refuse_after_join(const JsonView& json, const std::string& type, Input input, const char* why) {
  throw NotSupportedError(
      "tokenizer", str_cat(json.where(), ".type: the decoder '", type, "' after ",
                           input == Input::joined_bytes ? "ByteLevel" : "Fuse", " is not supported (", why, ")"));
}

std::string one_character(const JsonView& json) {
  const std::string& text = json.as_string();
  if (text.empty() || utf8_sequence_length(text, 0) != text.size())
    json.fail(str_cat("is not one character ('", text, "')"));
  return text;
}

size_t count_or(const JsonView& json, std::string_view key, size_t fallback) {
  const auto value = json.find(key);
  if (!value) return fallback;
  const int64_t n = value->as_int();
  if (n < 0) value->fail(str_cat("is negative (", n, ")"));
  return static_cast<size_t>(n);
}

// `input` is what the decoder receives; on return, what it puts out.
std::unique_ptr<Decoder> parse(const JsonView& json, Input& input, int depth) {
  if (depth > kMaxComponentDepth) json.fail("is nested too deeply");
  const std::string& type = json.at("type").as_string();
  if (input == Input::joined_bytes && type != "Fuse" && type != "Sequence")
    refuse_after_join(json, type, input, "its input is bytes, not text");
  if (type == "ByteLevel") {
    if (input != Input::tokens) refuse_after_join(json, type, input, "it needs whole tokens");
    input = Input::joined_bytes;
    return std::make_unique<StageDecoder<ByteLevelStage, NoSettings>>(NoSettings{});
  }
  if (type == "Fuse") {
    if (input == Input::tokens) input = Input::joined_text;
    return std::make_unique<StageDecoder<FuseStage, NoSettings>>(NoSettings{});
  }
  if (type == "ByteFallback") {
    if (input != Input::tokens) refuse_after_join(json, type, input, "it needs whole tokens");
    return std::make_unique<StageDecoder<ByteFallbackStage, NoSettings>>(NoSettings{});
  }
  if (type == "Replace") {
    const JsonView pattern = json.at("pattern");
    ReplaceSettings settings;
    settings.content = json.at("content").as_string();
    try {
      settings.regex = std::make_shared<const Regex>(parse_pattern(pattern));
    } catch (const ValueError& e) {
      pattern.fail(bare_message(e));
    }
    if (input != Input::tokens) {
      const auto literal = pattern.find("String");
      if (!literal || literal->as_string().empty() ||
          utf8_sequence_length(literal->as_string(), 0) != literal->as_string().size())
        refuse_after_join(json, type, input, "only a one-character String pattern can be replaced piece by piece");
    }
    return std::make_unique<StageDecoder<ReplaceStage, ReplaceSettings>>(std::move(settings));
  }
  if (type == "Metaspace") {
    return std::make_unique<StageDecoder<MetaspaceStage, MetaspaceSettings>>(
        MetaspaceSettings{parse_metaspace_options(json), input != Input::tokens});
  }
  if (type == "Strip") {
    StripSettings settings;
    settings.content = one_character(json.at("content"));
    settings.start = count_or(json, "start", 0);
    settings.stop = count_or(json, "stop", 0);
    settings.joined = input != Input::tokens;
    return std::make_unique<StageDecoder<StripStage, StripSettings>>(std::move(settings));
  }
  if (type == "Sequence") {
    const JsonView list = json.at("decoders");
    list.expect_array();
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) parts.push_back(parse(list.element(i), input, depth + 1));
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw NotSupportedError("tokenizer", str_cat(json.where(), ".type: the decoder '", type, "' is not supported"));
}

}  // namespace

bool parse_byte_token(std::string_view token, unsigned char& byte) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = token[3] == '+' ? 0 : hex(token[3]), low = hex(token[4]);
  if (high < 0 || low < 0) return false;
  byte = static_cast<unsigned char>(high * 16 + low);
  return true;
}

std::unique_ptr<Decoder> make_byte_level_decoder() {
  return std::make_unique<StageDecoder<ByteLevelStage, NoSettings>>(NoSettings{});
}
std::unique_ptr<Decoder> make_join_decoder() {
  return std::make_unique<StageDecoder<JoinStage, NoSettings>>(NoSettings{});
}

std::unique_ptr<Decoder> parse_decoder(const JsonView& json) {
  Input input = Input::tokens;
  return parse(json, input, 0);
}

}  // namespace microllm::tokenizer_detail
