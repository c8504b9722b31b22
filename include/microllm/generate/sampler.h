// Choosing the next token from a row of logits: greedy, or sampling with temperature, top-k, top-p
// (nucleus), min-p, a logit bias, and repetition / presence / frequency penalties, from a seeded Philox generator (the same seed
// gives the same text). Runs on the host over one f32 row, by the same rule as the sample_tokens op
// (ops/sampling.h) runs on any device: call k of a Sampler returns what sample_tokens returns for a row with
// the same parameters (rounded to f32), the same counts and rng (seed, k).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "microllm/core/random.h"

namespace microllm::generate {

struct SamplingParams {
  double temperature = 1.0;         // 0: greedy (argmax)
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double min_p = 0.0;               // keep tokens with p >= min_p * p_max; 0: off
  double repetition_penalty = 1.0;  // CTRL's: logits of seen tokens divided (> 0) or multiplied (< 0) by it
  double presence_penalty = 0.0;    // OpenAI's: subtracted once from the logit of every token seen
  double frequency_penalty = 0.0;   // OpenAI's: subtracted once per occurrence
  // OpenAI's logit_bias: (token id, bias) added to those logits before the penalties, as f32; ids must be in
  // the vocabulary (checked where the vocabulary is known: the Sampler, make_sampler_rows).
  std::vector<std::pair<int32_t, double>> logit_bias = {};
  uint64_t seed = 0;

  // The parameters as one f32 row of SamplerRows::params (ops/sampling.h); its kLogitBias column says
  // whether logit_bias is set (the biases themselves go to SamplerRows::bias: bias_row()).
  std::vector<float> row() const;
  // logit_bias as make_sampler_rows takes it.
  std::vector<std::pair<int32_t, float>> bias_row() const;
  // ValueError naming the parameter when one is out of range.
  void check() const;
  // Whether a penalty is on (then the counts of the prompt's and the generated ids matter).
  bool penalized() const { return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0; }
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);
  // The next token from logits[vocab]; `history` (prompt and generated ids) feeds the penalties. Every call
  // takes the next counter of the generator (greedy calls too).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return params_; }
  Generator& generator() { return gen_; }

 private:
  SamplingParams params_;
  Generator gen_;
};

}  // namespace microllm::generate
