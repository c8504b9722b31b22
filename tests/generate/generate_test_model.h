// A tiny random TransformerLM for the generate tests (CPU, f32), and random prompts.
#pragma once

#include <cstdint>
#include <vector>

#include "microllm/core/random.h"
#include "microllm/nn/transformer.h"

namespace microllm::generate::testing_model {

// Weights wide enough (std 0.2) that the logits of a random model are well separated: greedy choices
// do not hinge on rounding.
inline nn::TransformerConfig tiny_config(int64_t max_positions = 64) {
  nn::TransformerConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.rope.theta = 10000;
  c.initializer_range = 0.2;
  c.max_position_embeddings = max_positions;
  return c;
}

inline std::vector<int32_t> random_prompt(Generator& gen, size_t length, int64_t vocab) {
  std::vector<int32_t> p(length);
  for (int32_t& id : p) id = static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab)));
  return p;
}

}  // namespace microllm::generate::testing_model
