// The parts of a loaded tokenizer and the encode/decode pipeline over them:
//   text -> added tokens split out (raw, then normalized) -> normalizer on the pieces between them ->
//   pre-tokenizer -> the model (BPE or Unigram) per word -> post-processor (add_special_tokens); and back: ids -> token
//   texts -> decoder stream -> bytes -> UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace microllm::tokenizer_detail {

struct TokenizerImpl {
  std::string source;  // the file or directory, for messages
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;  // BPE or Unigram
  AddedVocabulary added;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;  // never null (the join decoder stands for "none")

  // From tokenizer_config.json (or the GPT-2 conventions).
  std::optional<std::string> bos_token, eos_token, pad_token;
  std::optional<std::string> chat_template;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The token text a decode hands the decoder for `id`; null for an unknown id or a skipped special token.
  const std::string* token_to_decode(int32_t id, bool skip_special_tokens) const;
};

// tokenizer.json's parsed text (loader.cpp). `file` names it in errors.
std::shared_ptr<TokenizerImpl> parse_tokenizer_json(std::string_view text, const std::string& file);
std::shared_ptr<TokenizerImpl> load_tokenizer(const std::string& path);
std::shared_ptr<TokenizerImpl> load_bpe_files(const std::string& vocab_path, const std::string& merges_path);

// Added tokens get ids as Hugging Face's AddedVocabulary::add_tokens gives them: the id of the same
// content in the model's vocabulary, else the next free id after the model's.
std::vector<AddedTokenInfo> assign_added_token_ids(std::vector<AddedTokenInfo> tokens, const Model& model);

}  // namespace microllm::tokenizer_detail
