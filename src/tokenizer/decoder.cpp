#include "tokenizer/decoder.h"

#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"

namespace microllm::tokenizer_detail {

namespace {

class ByteLevel final : public Decoder {
 public:
  void append(std::string_view token, bool, std::string& out) const override {
    // A token with a character outside the byte alphabet (an added token) contributes its own bytes.
    if (!byte_level_decode(token, out)) out.append(token);
  }
};

class Join final : public Decoder {
 public:
  void append(std::string_view token, bool first, std::string& out) const override {
    if (!first) out += ' ';
    out.append(token);
  }
};

// Only per-token decoders compose this way; ByteLevel is the one this layer has.
class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void append(std::string_view token, bool first, std::string& out) const override {
    std::string current(token), next;
    for (const auto& p : parts_) {
      next.clear();
      p->append(current, first, next);
      current.swap(next);
    }
    out += current;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevel>(); }
std::unique_ptr<Decoder> make_join_decoder() { return std::make_unique<Join>(); }

std::unique_ptr<Decoder> parse_decoder(const JsonView& json, int depth) {
  if (depth > kMaxComponentDepth) json.fail("is nested too deeply");
  const std::string& type = json.at("type").as_string();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Sequence") {
    const JsonView list = json.at("decoders");
    list.expect_array();
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) parts.push_back(parse_decoder(list.element(i), depth + 1));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw NotSupportedError("tokenizer", str_cat(json.where(), ".type: the decoder '", type, "' is not supported"));
}

}  // namespace microllm::tokenizer_detail
