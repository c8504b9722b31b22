// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split (a String or Regex pattern, any behavior,
// invert), ByteLevel (with GPT-2's regex when use_regex), Metaspace (SentencePiece's "▁" for spaces),
// Digits, Whitespace, WhitespaceSplit and Sequence. They cut each piece of text between added tokens into
// the words the model sees; ByteLevel also rewrites each word into the byte-level alphabet.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_view.h"

namespace microllm::tokenizer_detail {

// A piece of text on its way to the model. `at_text_start`: it begins at offset 0 of the encoded text
// (Hugging Face's offsets_original().0 == 0, which Metaspace's prepend_scheme "first" asks for).
struct PreToken {
  std::string text;
  bool at_text_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by the pieces it splits into; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// Metaspace's settings, shared by the pre-tokenizer and the decoder of that name.
enum class PrependScheme { first, always, never };
struct MetaspaceOptions {
  std::string replacement;  // one character, "▁" (U+2581) in every known file
  PrependScheme prepend_scheme = PrependScheme::always;
  bool split = true;
};
// As Hugging Face reads them: prepend_scheme defaults to "always", split to true, and the older
// add_prefix_space = false must come with prepend_scheme "never".
MetaspaceOptions parse_metaspace_options(const JsonView& json);

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonView& json, int depth = 0);

// GPT-2's pre-tokenizer as Hugging Face builds it for vocab.json + merges.txt (ByteLevel, use_regex).
std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex);
// Qwen2's: Split on its regex (Isolated), then ByteLevel without regex.
std::unique_ptr<PreTokenizer> make_qwen2_pre_tokenizer();

// The regexes of GPT-2 (ByteLevel) and of Qwen2 (Qwen2Tokenizer's PRETOKENIZE_REGEX).
extern const char* const kGpt2Pattern;
extern const char* const kQwen2Pattern;

}  // namespace microllm::tokenizer_detail
