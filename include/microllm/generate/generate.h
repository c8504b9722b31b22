// The decode loop of a TransformerLM: one forward over the prompt fills the KV cache, then one token per
// step; each token goes to a callback as soon as it is chosen (streaming).
//
//   generate()       one prompt, ids in and ids out;
//   generate_text()  one prompt, with an incremental decoder: streams text, honours stop strings;
//   generate_batch() several prompts of different lengths together (left padding, a padding mask and
//                    per-sequence positions over one KV cache); greedily, each sequence gets the tokens
//                    generate() gives it alone.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/generate/sampler.h"
#include "microllm/generate/stop.h"
#include "microllm/nn/transformer.h"

namespace microllm::generate {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int64_t> stop_ids;  // generation stops after emitting one (the model's eos ids, say)
  // generate_text only (they need text): the text ends before the first occurrence of any of them.
  std::vector<std::string> stop_strings;
  DType compute_dtype = DType::f32;
};

enum class FinishReason {
  length,       // max_new_tokens generated
  eos,          // a stop id was generated
  stop_string,  // the text reached a stop string
  context,      // the sequence filled the model's max_position_embeddings
  callback,     // the callback asked to stop
};
const char* finish_reason_name(FinishReason reason);

struct Generation {
  std::vector<int32_t> tokens;  // generated ids, not the prompt (a stop id that ended it included)
  std::string text;             // generate_text: the text streamed (without stop ids or the stop string)
  FinishReason finish_reason = FinishReason::length;
};

// Returns the generated ids (not the prompt). on_token returns false to stop early. The prompt must not be
// empty; generation also stops when the sequence reaches the model's max_position_embeddings. The model
// runs on the device of its parameters. options.stop_strings must be empty (use generate_text).
std::vector<int32_t> generate(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<bool(int32_t token)>& on_token = nullptr);

// Turns ids into text one at a time (a Tokenizer's StreamDecoder fits: push = its push, finish = its finish).
struct TextDecoder {
  std::function<std::string(int32_t id)> push;  // the text that became complete with this id
  std::function<std::string()> finish;          // what is left at the end (may be empty)
};

// generate() with text: each generated id that is not a stop id goes through `decoder`, then through a
// StopStringMatcher over options.stop_strings; on_text receives the text as soon as it is decided (never
// a part of a stop string, never retracted) and returns false to stop. Stop ids are not decoded.
Generation generate_text(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                         const GenerateOptions& options, const TextDecoder& decoder,
                         const std::function<bool(std::string_view text)>& on_text = nullptr);

// Several prompts (any lengths, none empty) prefilled and decoded together: prompts are padded on the left
// to the longest, padding keys are masked out of attention and each sequence's positions start at 0
// at its first real token, so every sequence computes what it would alone. Sequence i samples with the
// seed options.sampling.seed + i (so a batch of one prompt repeated gives different samples, and sequence
// i equals generate() with that seed). A sequence that finishes (stop id, max_new_tokens, its context,
// on_token returning false) stops emitting; the batch runs until all have. options.stop_strings must be
// empty. Returns one Generation per prompt (text empty).
std::vector<Generation> generate_batch(const nn::TransformerLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                       const GenerateOptions& options,
                                       const std::function<bool(size_t sequence, int32_t token)>& on_token = nullptr);

}  // namespace microllm::generate
