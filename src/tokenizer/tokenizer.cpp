// The encode/decode pipeline and the public Tokenizer and StreamDecoder.
#include "microllm/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "microllm/core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace microllm {

namespace tokenizer_detail {

std::vector<int32_t> TokenizerImpl::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = utf8_first_invalid(text);
  if (bad != text.size()) throw ValueError("tokenizer", str_cat("encode: the text is not UTF-8 (byte ", bad, ")"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<PreToken> words;
  for (Segment& segment : added.split(text, normalizer.get())) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    words.clear();
    words.push_back({std::move(segment.text), segment.at_text_start});
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(words);
    for (const PreToken& word : words) model->tokenize(word.text, ids);
  }
  if (add_special_tokens && post_processor) post_processor->process(ids);
  return ids;
}

std::optional<int32_t> TokenizerImpl::token_to_id(std::string_view token) const {
  if (const AddedTokenInfo* t = added.by_content(token)) return t->id;
  return model->token_to_id(token);
}

const std::string* TokenizerImpl::id_to_token(int32_t id) const {
  if (const AddedTokenInfo* t = added.by_id(id)) return &t->content;
  return model->id_to_token(id);
}

bool TokenizerImpl::is_special(int32_t id) const {
  const AddedTokenInfo* t = added.by_id(id);
  return t != nullptr && t->special;
}

const std::string* TokenizerImpl::token_to_decode(int32_t id, bool skip_special_tokens) const {
  const std::string* token = id_to_token(id);
  if (token == nullptr) return nullptr;
  if (skip_special_tokens) {
    // Hugging Face skips by content: any id whose token text is a special added token.
    const AddedTokenInfo* t = added.by_content(*token);
    if (t != nullptr && t->special) return nullptr;
  }
  return token;
}

}  // namespace tokenizer_detail

using tokenizer_detail::TokenizerImpl;

Tokenizer Tokenizer::load(const std::string& path) { return Tokenizer(tokenizer_detail::load_tokenizer(path)); }

std::optional<Tokenizer> Tokenizer::load_if_present(const std::string& directory) {
  const std::filesystem::path dir(directory);
  for (const char* file : {"tokenizer.json", "vocab.json", "encoder.json", "tokenizer.model"}) {
    if (std::filesystem::is_regular_file(dir / file)) return load(directory);
  }
  return std::nullopt;
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& name) {
  return Tokenizer(tokenizer_detail::parse_tokenizer_json(json_text, name));
}

Tokenizer Tokenizer::from_bpe_files(const std::string& vocab_path, const std::string& merges_path) {
  return Tokenizer(tokenizer_detail::load_bpe_files(vocab_path, merges_path));
}

size_t first_invalid_utf8(std::string_view text) { return tokenizer_detail::utf8_first_invalid(text); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  const std::unique_ptr<tokenizer_detail::DecodeStream> stream = impl_->decoder->open();
  for (const int32_t id : ids) {
    if (const std::string* token = impl_->token_to_decode(id, skip_special_tokens)) stream->put(*token, bytes);
  }
  stream->finish(bytes);
  return tokenizer_detail::utf8_lossy(bytes);
}

StreamDecoder Tokenizer::stream_decoder(bool skip_special_tokens) const {
  return StreamDecoder(impl_, skip_special_tokens);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->id_to_token(id);
  return token == nullptr ? std::nullopt : std::optional<std::string>(*token);
}

size_t Tokenizer::vocab_size() const {
  // Distinct token texts, as Hugging Face's get_vocab(with_added_tokens).len().
  size_t n = impl_->model->vocab_size();
  for (const auto& t : impl_->added.tokens()) {
    if (impl_->added.by_content(t.content) == &t && !impl_->model->token_to_id(t.content)) ++n;
  }
  return n;
}

bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }

namespace {
std::optional<int32_t> id_of(const TokenizerImpl& impl, const std::optional<std::string>& token) {
  return token ? impl.token_to_id(*token) : std::nullopt;
}
}  // namespace

std::optional<int32_t> Tokenizer::bos_id() const {
  if (impl_->bos_token) return id_of(*impl_, impl_->bos_token);
  return impl_->post_processor ? impl_->post_processor->leading_id() : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_id() const { return id_of(*impl_, impl_->eos_token); }
std::optional<int32_t> Tokenizer::pad_id() const { return id_of(*impl_, impl_->pad_token); }

std::optional<std::string> Tokenizer::bos_token() const {
  if (impl_->bos_token) return impl_->bos_token;
  const auto id = bos_id();
  return id ? id_to_token(*id) : std::nullopt;
}
std::optional<std::string> Tokenizer::eos_token() const { return impl_->eos_token; }

std::vector<int32_t> Tokenizer::stop_ids(bool chat) const {
  std::vector<int32_t> ids;
  if (const std::optional<int32_t> eos = eos_id()) ids.push_back(*eos);
  if (chat) {
    for (const char* end_of_turn :
         {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<end_of_turn>", "<|end|>"}) {
      const std::optional<int32_t> id = token_to_id(end_of_turn);
      if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
    }
  }
  return ids;
}

std::optional<std::string> Tokenizer::chat_template_source() const { return impl_->chat_template; }

ChatTemplate Tokenizer::chat_template() const {
  if (!impl_->chat_template) {
    throw NotSupportedError("tokenizer",
                            str_cat(impl_->source, ": no chat template (tokenizer_config.json has no chat_template)"));
  }
  return ChatTemplate::from_source(*impl_->chat_template, impl_->bos_token.value_or(""), impl_->eos_token.value_or(""));
}

const std::string& Tokenizer::source() const { return impl_->source; }

StreamDecoder::StreamDecoder(std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl, bool skip_special_tokens)
    : impl_(std::move(impl)), skip_special_tokens_(skip_special_tokens), stream_(impl_->decoder->open()) {}
StreamDecoder::~StreamDecoder() = default;
StreamDecoder::StreamDecoder(StreamDecoder&&) noexcept = default;
StreamDecoder& StreamDecoder::operator=(StreamDecoder&&) noexcept = default;

std::string StreamDecoder::push(int32_t id) {
  if (const std::string* token = impl_->token_to_decode(id, skip_special_tokens_)) stream_->put(*token, pending_);
  // Emit all but an unfinished character at the end; ill-formed bytes before it are final (U+FFFD).
  const size_t keep = tokenizer_detail::utf8_incomplete_tail(pending_);
  std::string out = tokenizer_detail::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::push(std::span<const int32_t> ids) {
  std::string out;
  for (const int32_t id : ids) out += push(id);
  return out;
}

std::string StreamDecoder::finish() {
  stream_->finish(pending_);
  std::string out = tokenizer_detail::utf8_lossy(pending_);
  pending_.clear();
  stream_ = impl_->decoder->open();  // ready for another sequence
  return out;
}

}  // namespace microllm
