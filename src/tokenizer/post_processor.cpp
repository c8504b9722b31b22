#include "tokenizer/post_processor.h"

#include <map>
#include <string>

#include "tokenizer/normalizer.h"

namespace microllm::tokenizer_detail {

namespace {

// A template is a list of pieces: the sequence ($A) or the ids of a special token.
class Template final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int32_t> ids;  // of a special token
  };
  explicit Template(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + pieces_.size());
    for (const Piece& p : pieces_) {
      if (p.is_sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids = std::move(out);
  }
  std::optional<int32_t> leading_id() const override {
    if (pieces_.empty() || pieces_[0].is_sequence || pieces_[0].ids.empty()) return std::nullopt;
    return pieces_[0].ids[0];
  }

 private:
  std::vector<Piece> pieces_;
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  std::optional<int32_t> leading_id() const override {
    std::optional<int32_t> id;
    for (const auto& p : parts_) {
      if (auto l = p->leading_id()) id = l;
    }
    return id;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class Nothing final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

// "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], or the
// string forms "<s>:0" and "$A:0".
std::unique_ptr<PostProcessor> parse_template(const JsonView& json) {
  const JsonView special = json.at("special_tokens");
  special.expect_object();
  auto special_ids = [&](const std::string& name, const JsonView& where) {
    const auto entry = special.find(name);
    if (!entry) where.fail(str_cat("names the special token '", name, "', which post_processor.special_tokens lacks"));
    const JsonView ids = entry->at("ids");
    ids.expect_array();
    std::vector<int32_t> out;
    for (size_t i = 0; i < ids.size(); ++i) out.push_back(ids.element(i).as_id());
    return out;
  };
  const JsonView single = json.at("single");
  single.expect_array();
  std::vector<Template::Piece> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonView piece = single.element(i);
    std::string sequence_id;
    if (piece.is_string()) {
      std::string text = piece.as_string();
      const size_t colon = text.rfind(':');
      if (colon != std::string::npos) text = text.substr(0, colon);
      if (!text.empty() && text[0] == '$') {
        sequence_id = text.size() == 1 ? "A" : text.substr(1);
      } else {
        pieces.push_back({false, special_ids(text, piece)});
        continue;
      }
    } else if (const auto seq = piece.find("Sequence")) {
      sequence_id = seq->at("id").as_string();
    } else if (const auto tok = piece.find("SpecialToken")) {
      pieces.push_back({false, special_ids(tok->at("id").as_string(), *tok)});
      continue;
    } else {
      piece.fail("is neither a Sequence nor a SpecialToken");
    }
    if (sequence_id != "A" && sequence_id != "0") piece.fail("uses sequence B in the single-sequence template");
    pieces.push_back({true, {}});
  }
  return std::make_unique<Template>(std::move(pieces));
}

// RobertaProcessing/BertProcessing: {"cls": ["<s>", 0], "sep": ["</s>", 2]} -> cls $A sep.
std::unique_ptr<PostProcessor> parse_cls_sep(const JsonView& json) {
  auto id_of = [&](const char* key) {
    const JsonView pair = json.at(key);
    pair.expect_array();
    if (pair.size() != 2) pair.fail("is not a [token, id] pair");
    return pair.element(1).as_id();
  };
  std::vector<Template::Piece> pieces{{false, {id_of("cls")}}, {true, {}}, {false, {id_of("sep")}}};
  return std::make_unique<Template>(std::move(pieces));
}

}  // namespace

std::unique_ptr<PostProcessor> make_bos_eos_processor(std::optional<int32_t> bos, std::optional<int32_t> eos) {
  std::vector<Template::Piece> pieces;
  if (bos) pieces.push_back({false, {*bos}});
  pieces.push_back({true, {}});
  if (eos) pieces.push_back({false, {*eos}});
  return std::make_unique<Template>(std::move(pieces));
}

std::unique_ptr<PostProcessor> parse_post_processor(const JsonView& json, int depth) {
  if (depth > kMaxComponentDepth) json.fail("is nested too deeply");
  const std::string& type = json.at("type").as_string();
  if (type == "ByteLevel") return std::make_unique<Nothing>();
  if (type == "TemplateProcessing") return parse_template(json);
  if (type == "RobertaProcessing" || type == "BertProcessing") return parse_cls_sep(json);
  if (type == "Sequence") {
    const JsonView list = json.at("processors");
    list.expect_array();
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.size(); ++i) parts.push_back(parse_post_processor(list.element(i), depth + 1));
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw NotSupportedError("tokenizer",
                          str_cat(json.where(), ".type: the post-processor '", type, "' is not supported"));
}

}  // namespace microllm::tokenizer_detail
