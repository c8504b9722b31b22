// Loading: tokenizer.json, a model directory (tokenizer.json + tokenizer_config.json), or GPT-2 style
// vocab.json + merges.txt. Every malformed field is a ParseError naming the file and the field.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <unordered_map>

#include "microllm/core/error.h"
#include "tokenizer/json_view.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unigram.h"

namespace microllm::tokenizer_detail {

namespace fs = std::filesystem;

namespace {

AddedTokenInfo parse_added_token(const JsonView& json) {
  json.expect_object();
  AddedTokenInfo t;
  t.id = json.at("id").as_id();
  t.content = json.at("content").as_string();
  t.special = json.bool_or("special", false);
  t.single_word = json.bool_or("single_word", false);
  t.lstrip = json.bool_or("lstrip", false);
  t.rstrip = json.bool_or("rstrip", false);
  t.normalized = json.bool_or("normalized", !t.special);
  return t;
}

// A merge as "a b" or ["a", "b"] without building its path (there are half a million in Gemma 3's file);
// nullopt when it is neither, for parse_merge to say why.
std::optional<std::pair<std::string, std::string>> plain_merge(const Json& json) {
  if (json.is_string()) {
    const std::string& line = json.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) return std::nullopt;
    return std::pair{line.substr(0, space), line.substr(space + 1)};
  }
  if (json.is_array() && json.size() == 2 && json[0].is_string() && json[1].is_string())
    return std::pair{json[0].get<std::string>(), json[1].get<std::string>()};
  return std::nullopt;
}

std::pair<std::string, std::string> parse_merge(const JsonView& json) {
  if (json.is_string()) {  // "a b"
    const std::string& line = json.as_string();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      json.fail(str_cat("is not two tokens separated by one space ('", line, "')"));
    }
    return {line.substr(0, space), line.substr(space + 1)};
  }
  if (json.is_array() && json.size() == 2 && json.json()[0].is_string() && json.json()[1].is_string()) {  // ["a", "b"]
    return {json.json()[0].get<std::string>(), json.json()[1].get<std::string>()};
  }
  json.fail("is not a string or a pair");
}

Vocab parse_vocab(const JsonView& json) {
  json.expect_object();
  Vocab vocab;
  vocab.reserve(json.size());
  for (const auto& [token, value] : json.json().items()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)) {
      vocab.emplace(token, static_cast<int32_t>(value.get<uint64_t>()));  // the usual case, without a path
      continue;
    }
    const JsonView entry(value, json.file(), str_cat(json.path().empty() ? "" : json.path(), "[\"", token, "\"]"));
    vocab.emplace(token, entry.as_id());
  }
  return vocab;
}

std::optional<std::string> optional_string_or_null(const JsonView& json, std::string_view key) {
  return json.optional_string(key);
}

// Unigram: "vocab" is a list of [piece, score]; "unk_id" an index into it or null.
std::unique_ptr<Model> parse_unigram_model(const JsonView& model) {
  const JsonView list = model.at("vocab");
  list.expect_array();
  std::vector<std::pair<std::string, double>> pieces;
  pieces.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& entry = list.json()[i];
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number())
      list.element(i).fail("is not a [piece, score] pair");
    pieces.emplace_back(entry[0].get<std::string>(), entry[1].get<double>());
  }
  std::optional<int32_t> unk_id;
  if (const auto unk = model.find("unk_id")) {
    unk_id = unk->as_id();
    if (static_cast<size_t>(*unk_id) >= pieces.size())
      unk->fail(str_cat("is not an index into model.vocab (", *unk_id, "; it has ", pieces.size(), " pieces)"));
  }
  return std::make_unique<UnigramModel>(std::move(pieces), unk_id, model.bool_or("byte_fallback", false));
}

std::unique_ptr<Model> parse_model(const JsonView& model) {
  model.expect_object();
  if (const auto type = model.find("type"); type && type->as_string() != "BPE") {
    if (type->as_string() == "Unigram") return parse_unigram_model(model);
    throw NotSupportedError("tokenizer", str_cat(type->where(), ": the model '", type->as_string(),
                                                 "' is not supported (only BPE and Unigram)"));
  }
  if (const auto dropout = model.find("dropout")) {
    if (!dropout->json().is_number())
      dropout->fail(str_cat("is not a number (it is ", json_type_name(dropout->json()), ")"));
    if (dropout->json().get<double>() > 0) {
      throw NotSupportedError("tokenizer", str_cat(dropout->where(), ": BPE dropout (random merges) is not supported"));
    }
  }
  Vocab vocab = parse_vocab(model.at("vocab"));
  std::vector<std::pair<std::string, std::string>> merges;
  if (const auto list = model.find("merges")) {
    list->expect_array();
    merges.reserve(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      auto merge = plain_merge(list->json()[i]);
      merges.push_back(merge ? std::move(*merge) : parse_merge(list->element(i)));
    }
  }
  BpeOptions options;
  options.unk_token = optional_string_or_null(model, "unk_token");
  options.continuing_subword_prefix = optional_string_or_null(model, "continuing_subword_prefix");
  options.end_of_word_suffix = optional_string_or_null(model, "end_of_word_suffix");
  options.fuse_unk = model.bool_or("fuse_unk", false);
  options.byte_fallback = model.bool_or("byte_fallback", false);
  options.ignore_merges = model.bool_or("ignore_merges", false);
  const std::string merges_path = str_cat(model.where(), ".merges");
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options),
                                    [&](size_t i) { return str_cat(merges_path, "[", i, "]"); });
}

// bos_token and friends in tokenizer_config.json: a string, {"content": "..."} (an AddedToken), or null.
std::optional<std::string> config_token(const JsonView& config, std::string_view key) {
  const auto value = config.find(key);
  if (!value) return std::nullopt;
  if (value->is_string()) return value->as_string();
  if (value->is_object()) return value->at("content").as_string();
  value->fail(str_cat("is not a string or an object with 'content' (it is ", json_type_name(value->json()), ")"));
}

std::optional<std::string> config_chat_template(const JsonView& config) {
  const auto value = config.find("chat_template");
  if (!value) return std::nullopt;
  if (value->is_string()) return value->as_string();
  // A list of named templates: the one named "default", else the first.
  value->expect_array();
  std::optional<std::string> first;
  for (size_t i = 0; i < value->size(); ++i) {
    const JsonView entry = value->element(i);
    const std::string& name = entry.at("name").as_string();
    const std::string& text = entry.at("template").as_string();
    if (name == "default") return text;
    if (!first) first = text;
  }
  return first;
}

// tokenizer_config.json's added_tokens_decoder: {"151643": {"content": ..., "special": true, ...}, ...}.
std::vector<AddedTokenInfo> config_added_tokens(const JsonView& config) {
  std::vector<AddedTokenInfo> tokens;
  const auto decoder = config.find("added_tokens_decoder");
  if (!decoder) return tokens;
  decoder->expect_object();
  std::vector<std::pair<int64_t, AddedTokenInfo>> by_id;
  for (const auto& [key, value] : decoder->json().items()) {
    const JsonView entry(value, config.file(), str_cat(decoder->path(), "[\"", key, "\"]"));
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX) entry.fail("has a key that is not a token id");
    AddedTokenInfo t;
    t.id = static_cast<int32_t>(id);
    entry.expect_object();
    t.content = entry.at("content").as_string();
    t.special = entry.bool_or("special", false);
    t.single_word = entry.bool_or("single_word", false);
    t.lstrip = entry.bool_or("lstrip", false);
    t.rstrip = entry.bool_or("rstrip", false);
    t.normalized = entry.bool_or("normalized", !t.special);
    by_id.emplace_back(id, std::move(t));
  }
  std::sort(by_id.begin(), by_id.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [id, t] : by_id) tokens.push_back(std::move(t));
  return tokens;
}

struct Config {
  std::string path;
  Json json;
};

std::optional<Config> read_config(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(path)) return std::nullopt;
  Config c{path.string(), {}};
  c.json = read_json_file(c.path);
  JsonView(c.json, c.path).expect_object();
  return c;
}

// What transformers takes from tokenizer_config.json on top of the tokenizer's pipeline.
void apply_config(TokenizerImpl& impl, const Config& config, const fs::path& dir) {
  const JsonView c(config.json, config.path);
  impl.bos_token = config_token(c, "bos_token");
  impl.eos_token = config_token(c, "eos_token");
  impl.pad_token = config_token(c, "pad_token");
  impl.chat_template = config_chat_template(c);
  const fs::path jinja = dir / "chat_template.jinja";  // newer transformers save the template beside the config
  if (fs::is_regular_file(jinja)) impl.chat_template = read_text_file(jinja.string());

  // LlamaTokenizerFast rebuilds the post-processor from add_bos_token (default true) / add_eos_token.
  const std::string tokenizer_class = c.optional_string("tokenizer_class").value_or("");
  if (tokenizer_class == "LlamaTokenizerFast" || tokenizer_class == "LlamaTokenizer") {
    const bool add_bos = c.bool_or("add_bos_token", true), add_eos = c.bool_or("add_eos_token", false);
    auto id_for = [&](bool wanted, const std::optional<std::string>& token, const char* key) -> std::optional<int32_t> {
      if (!wanted) return std::nullopt;
      const auto id = token ? impl.token_to_id(*token) : std::nullopt;
      if (!id) {
        throw ParseError("tokenizer", str_cat(config.path, ": add_", key, "_token is on but ", key,
                                              "_token is not a token of the vocabulary"));
      }
      return id;
    };
    impl.post_processor =
        make_bos_eos_processor(id_for(add_bos, impl.bos_token, "bos"), id_for(add_eos, impl.eos_token, "eos"));
  }
}

std::vector<std::pair<std::string, std::string>> read_merges_file(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::pair<std::string, std::string>> merges;
  size_t pos = 0, line_number = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw ParseError("tokenizer",
                       str_cat(path, ":", line_number, ": '", line, "' is not two tokens separated by one space"));
    }
    merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  }
  return merges;
}

std::shared_ptr<TokenizerImpl> build_from_bpe_files(const std::string& vocab_path, const std::string& merges_path,
                                                    const Config* config) {
  auto impl = std::make_shared<TokenizerImpl>();
  impl->source = vocab_path;
  const Json vocab_json = read_json_file(vocab_path);
  Vocab vocab = parse_vocab(JsonView(vocab_json, vocab_path));
  const auto merges = read_merges_file(merges_path);
  impl->model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{},
                                           [&](size_t i) { return str_cat(merges_path, ": merge ", i + 1); });

  std::vector<AddedTokenInfo> added;
  std::string tokenizer_class;
  bool add_prefix_space = false;
  if (config != nullptr) {
    const JsonView c(config->json, config->path);
    tokenizer_class = c.optional_string("tokenizer_class").value_or("");
    add_prefix_space = c.bool_or("add_prefix_space", false);
    added = config_added_tokens(c);
  }
  if (tokenizer_class.rfind("Qwen2Tokenizer", 0) == 0) {
    // transformers' Qwen2 conversion: NFC, then its regex, then byte-level without regex.
    impl->normalizer = parse_normalizer(JsonView(Json{{"type", "NFC"}}, vocab_path));
    impl->pre_tokenizer = make_qwen2_pre_tokenizer();
  } else {
    // GPT-2: byte-level with GPT-2's regex; <|endoftext|> is bos, eos and unk.
    impl->pre_tokenizer = make_byte_level_pre_tokenizer(add_prefix_space, true);
    if (impl->model->token_to_id("<|endoftext|>")) {
      bool listed = false;
      for (const auto& t : added) listed = listed || t.content == "<|endoftext|>";
      if (!listed) added.insert(added.begin(), AddedTokenInfo{"<|endoftext|>", 0, true, false, false, false, false});
      impl->bos_token = impl->eos_token = "<|endoftext|>";
    }
  }
  impl->decoder = make_byte_level_decoder();
  impl->added = AddedVocabulary(assign_added_token_ids(std::move(added), *impl->model), impl->normalizer.get());
  return impl;
}

}  // namespace

std::vector<AddedTokenInfo> assign_added_token_ids(std::vector<AddedTokenInfo> tokens, const Model& model) {
  std::vector<AddedTokenInfo> out;
  std::unordered_map<std::string, size_t> index_of;
  const auto vocab_size = static_cast<int64_t>(model.vocab_size());
  int64_t max_id = -1;
  for (AddedTokenInfo& t : tokens) {
    if (t.content.empty()) continue;
    if (const auto it = index_of.find(t.content); it != index_of.end()) {
      t.id = out[it->second].id;  // the same text again: same id, the later flags
      out[it->second] = std::move(t);
      continue;
    }
    int64_t id = 0;
    if (const auto in_model = model.token_to_id(t.content))
      id = *in_model;
    else if (max_id < 0)
      id = vocab_size;
    else
      id = (max_id >= vocab_size || vocab_size == 0) ? max_id + 1 : vocab_size;
    if (id > INT32_MAX) throw ParseError("tokenizer", "too many added tokens");
    t.id = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
    index_of.emplace(t.content, out.size());
    out.push_back(std::move(t));
  }
  return out;
}

std::shared_ptr<TokenizerImpl> parse_tokenizer_json(std::string_view text, const std::string& file) {
  const Json root = parse_json(text, file);
  const JsonView top(root, file);
  top.expect_object();
  auto impl = std::make_shared<TokenizerImpl>();
  impl->source = file;
  impl->model = parse_model(top.at("model"));
  if (const auto n = top.find("normalizer")) impl->normalizer = parse_normalizer(*n);
  if (const auto p = top.find("pre_tokenizer")) impl->pre_tokenizer = parse_pre_tokenizer(*p);
  if (const auto p = top.find("post_processor")) impl->post_processor = parse_post_processor(*p);
  impl->decoder = top.find("decoder") ? parse_decoder(*top.find("decoder")) : make_join_decoder();
  std::vector<AddedTokenInfo> added;
  if (const auto list = top.find("added_tokens")) {
    list->expect_array();
    for (size_t i = 0; i < list->size(); ++i) added.push_back(parse_added_token(list->element(i)));
  }
  impl->added = AddedVocabulary(assign_added_token_ids(std::move(added), *impl->model), impl->normalizer.get());
  return impl;
}

std::shared_ptr<TokenizerImpl> load_bpe_files(const std::string& vocab_path, const std::string& merges_path) {
  return build_from_bpe_files(vocab_path, merges_path, nullptr);
}

// SentencePiece's binary model, which only its own library reads: refused with the way to convert it.
[[noreturn]] void refuse_sentencepiece_model(const std::string& where, const std::string& folder) {
  throw NotSupportedError(
      "tokenizer",
      str_cat(where,
              ": SentencePiece's tokenizer.model is not read here, only tokenizer.json (Hugging Face tokenizers); "
              "convert it once with transformers (and the sentencepiece and protobuf packages), which writes "
              "tokenizer.json beside it: python3 -c \"from transformers import AutoTokenizer; "
              "AutoTokenizer.from_pretrained('",
              folder, "').save_pretrained('", folder, "')\""));
}

std::shared_ptr<TokenizerImpl> load_tokenizer(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) {
    if (p.extension() == ".model")
      refuse_sentencepiece_model(path, p.parent_path().empty() ? "." : p.parent_path().string());
    return parse_tokenizer_json(read_text_file(path), path);
  }
  if (!fs::is_directory(p, ec)) throw IoError("tokenizer", str_cat(path, ": no such file or directory"));

  const std::optional<Config> config = read_config(p);
  std::shared_ptr<TokenizerImpl> impl;
  if (fs::is_regular_file(p / "tokenizer.json")) {
    const std::string file = (p / "tokenizer.json").string();
    impl = parse_tokenizer_json(read_text_file(file), file);
  } else {
    for (const auto& [vocab, merges] :
         {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
      if (fs::is_regular_file(p / vocab) && fs::is_regular_file(p / merges)) {
        impl = build_from_bpe_files((p / vocab).string(), (p / merges).string(), config ? &*config : nullptr);
        break;
      }
    }
  }
  if (!impl && fs::is_regular_file(p / "tokenizer.model"))
    refuse_sentencepiece_model(path + " has only tokenizer.model", path);
  if (!impl) {
    throw IoError("tokenizer",
                  str_cat(path, ": has no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe"));
  }
  impl->source = path;
  if (config) apply_config(*impl, *config, p);
  return impl;
}

}  // namespace microllm::tokenizer_detail
