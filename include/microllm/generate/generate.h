// The decode loop of a TransformerLM: one forward over the prompt fills the KV cache, then one token per
// step; each token goes to a callback as soon as it is chosen (streaming).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "microllm/generate/sampler.h"
#include "microllm/nn/transformer.h"

namespace microllm::generate {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int64_t> stop_ids;  // generation stops after emitting one (the model's eos ids, say)
  DType compute_dtype = DType::f32;
};

// Returns the generated ids (not the prompt). on_token returns false to stop early. The prompt must not be
// empty; generation also stops when the sequence reaches the model's max_position_embeddings. The model
// runs on the device of its parameters.
std::vector<int32_t> generate(const nn::TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<bool(int32_t token)>& on_token = nullptr);

}  // namespace microllm::generate
