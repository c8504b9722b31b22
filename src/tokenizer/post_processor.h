// Post-processors of tokenizer.json ("post_processor"): what encode(add_special_tokens = true) adds around
// the ids. TemplateProcessing (Llama 3's <|begin_of_text|>), RobertaProcessing, BertProcessing, ByteLevel
// (nothing to add: it only trims offsets) and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tokenizer/json_view.h"

namespace microllm::tokenizer_detail {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;  // called only with add_special_tokens
  // The id this processor puts first, if any (a tokenizer.json without tokenizer_config.json learns its
  // BOS token from here).
  virtual std::optional<int32_t> leading_id() const { return std::nullopt; }
};

std::unique_ptr<PostProcessor> parse_post_processor(const JsonView& json, int depth = 0);

// "[bos] $A [eos]", what transformers' LlamaTokenizerFast.update_post_processor builds.
std::unique_ptr<PostProcessor> make_bos_eos_processor(std::optional<int32_t> bos, std::optional<int32_t> eos);

}  // namespace microllm::tokenizer_detail
