// A tiny random TransformerLM for the generate tests (CPU, f32), and random prompts.
#pragma once

#include <cstdint>
#include <vector>

#include "microllm/core/device.h"
#include "microllm/core/dtype.h"
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

// The dtype of the tests that compare two computations of the same tokens token for token: a batch against
// each prompt alone, the engine against generate(). On the CPU the two runs take different BLAS kernels
// (OpenBLAS picks them by the matrix shape, so a row computed in a batch of 8 is rounded differently than
// alone) and different op compositions; their f32 logits differ by ~1e-6, which flipped a greedy argmax or a
// sampled draw in about one run of 3,000 (measured with --gtest_repeat). In f64 they differ by ~1e-15. The
// CUDA tests stay in f32: what they check is the kernels the engine runs in production.
inline DType exact_dtype(Device device) { return device.is_cpu() ? DType::f64 : DType::f32; }

inline std::vector<int32_t> random_prompt(Generator& gen, size_t length, int64_t vocab) {
  std::vector<int32_t> p(length);
  for (int32_t& id : p) id = static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab)));
  return p;
}

}  // namespace microllm::generate::testing_model
