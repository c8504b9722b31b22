// Sampling the next token of every row of a logits batch on the logits' device, with per-row parameters and
// per-row random counters kept on that device: only the B chosen ids need to reach the host, and a call needs
// no host-side scalars per step (so it can be captured in a CUDA graph).
//
// The rule (the one of generate::Sampler, defined in microllm/backend/sampling_math.h): the row's logit bias, then
// penalties from the counts;
// candidates by logit descending (ties: lower id first); temperature 0 takes the first; otherwise top-k, the
// softmax at the temperature (as integer weights trunc(2^31 exp((x - max) / T))), min-p relative to the
// largest, top-p (the shortest prefix reaching the mass), and the inverse CDF at u * kept mass with
// u = uniform_from_bits(philox4x32(seed, 0, offset)[0]). Every device returns the same ids.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "microllm/core/tensor.h"

namespace microllm {

// Per-row sampler state, B rows, on the logits' device. Narrowed views (rows 0..b of a max_batch state) work:
// the op reads and updates the elements through the views' strides.
struct SamplerRows {
  // f32 [B, 8]: temperature (0 = greedy), top_k (0 = off), top_p (1 = off), min_p (0 = off),
  // repetition_penalty (1 = off), presence_penalty, frequency_penalty, logit_bias (1: the row adds its row of
  // `bias`; 0: off).
  Tensor params;
  // i64 [B, 2]: seed, offset. A row's draw uses Philox(seed, counter offset); every call adds 1 to offset
  // (greedy rows too), on the device.
  Tensor rng;
  // i32 [B, V]: how often each id occurred in the prompt and the generated tokens (the penalties), or
  // undefined: no penalties for any row. Every call adds 1 at the chosen id of each row.
  Tensor counts;
  // f32 [B, V]: a bias added to each logit before the penalties (OpenAI's logit_bias), read only for rows whose
  // params say so; or undefined: no bias for any row.
  Tensor bias;
  // A host-side promise that every row of params has temperature 0 (greedy; penalties still apply and counts
  // are still updated). It lets the CUDA kernels skip the candidate pass, the sort and the choice: two launches
  // instead of about fourteen. make_sampler_rows sets it when every row it builds is greedy; whoever rewrites
  // params afterwards (the engine, per step) keeps it true only while the promise holds. A row that breaks it
  // is an error, never a silently greedy answer: the CPU throws ValueError before touching any state, CUDA
  // reports the row through the device error word and the next synchronization throws naming sample_tokens.
  // false: no promise (greedy rows are still exact, through the general path).
  bool greedy_only = false;
};

// logits [B, V] (f32, bf16 or f16; f64 is rounded to f32 first; any strides, e.g. a select() of [B, T, V]);
// out i32 [B] receives the ids.
void sample_tokens(const Tensor& logits, const SamplerRows& rows, const Tensor& out);
Tensor sample_tokens(const Tensor& logits, const SamplerRows& rows);  // a new i32 [B]

// One row's logit bias: (token id, bias) pairs.
using LogitBias = std::vector<std::pair<int32_t, float>>;

// A SamplerRows on `device` for `seeds.size()` rows of a `vocab`-token vocabulary: params from the host values
// (f32 [B, 8] row-major, as above), rng (seeds[b], 0), counts from `histories` (one list of ids per row,
// each id counted once per occurrence) or undefined when `histories` is empty, and bias from `biases` (one
// list per row, or none) or undefined when no row has one; a row's kLogitBias column says whether its list is
// not empty, whatever `params` held there; greedy_only when every row has temperature 0.
SamplerRows make_sampler_rows(const std::vector<float>& params, const std::vector<int64_t>& seeds, int64_t vocab,
                              const std::vector<std::vector<int32_t>>& histories, Device device,
                              const std::vector<LogitBias>& biases = {});

}  // namespace microllm
