// The next token of one row of logits: the one definition of the sampler's math, used by the host Sampler
// (src/generate/sampler.cpp), the CPU kernel (src/backend/cpu/sampling.cpp) and the CUDA kernels
// (src/backend/cuda/sampling.cu), so every device picks the same id from the same logits, parameters and
// counter. A host file that computes the weights must be compiled with -ffp-contract=off (src/CMakeLists.txt),
// so that no a * b + c is fused into an FMA the device's _rn intrinsics do not make.
//
// The rule (sample_row below is the readable reference):
//   1. bias and penalties: a row with a logit bias adds it first (x = x + bias[v], OpenAI's logit_bias); then
//      a token seen n > 0 times has x = (x > 0 ? x / rep : x * rep) - (presence + frequency * n);
//   2. candidates in order: logit descending, ties the lower id first (NaN counts as -inf);
//   3. greedy (temperature 0): the first candidate;
//   4. otherwise each candidate weighs w = trunc(2^31 exp((x - max) / T)), the softmax numerator as an integer;
//      top-k keeps the first k, min-p the prefix with w >= min_p * w_max, top-p the shortest prefix whose
//      weight reaches top_p of the top-k total; the draw is the first candidate whose running weight exceeds
//      u * kept weight, with u = uniform_from_bits(philox4x32(seed, 0, offset)[0]).
//
// Why integers: a sum of floats depends on its order, so a parallel scan on the GPU and the loop on the CPU
// would disagree whenever u lands within rounding of a boundary (often, over a flat 150k vocabulary). The
// weights are exact integers computed by a portable exp (f32, every operation rounded on its own, no libm), so
// every device gets the same bits and every sum is exact in any order. The cost: a token below 2^-31 of the
// most likely one weighs 0 and is never drawn.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "microllm/backend/portability.h"

namespace microllm::sampling {

// The columns of a row of SamplerRows::params (f32 [B, kParamCount]).
enum Param : int {
  kTemperature = 0,        // 0: greedy
  kTopK = 1,               // 0: off
  kTopP = 2,               // 1: off
  kMinP = 3,               // 0: off
  kRepetitionPenalty = 4,  // 1: off
  kPresencePenalty = 5,
  kFrequencyPenalty = 6,
  kLogitBias = 7,  // 1: the row adds its row of the bias tensor to the logits; 0: no bias (the tensor is not read)
  kParamCount = 8,
};

struct RowParams {
  float temperature = 1, top_k = 0, top_p = 1, min_p = 0;
  float repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  float logit_bias = 0;

  MICROLLM_HD bool greedy() const { return !(temperature > 0); }
  MICROLLM_HD bool biased() const { return logit_bias != 0; }
  MICROLLM_HD bool penalized() const {
    return repetition_penalty != 1 || presence_penalty != 0 || frequency_penalty != 0;
  }
  // How many candidates top-k lets through a row of `vocab` tokens.
  MICROLLM_HD int64_t top_k_limit(int64_t vocab) const {
    return top_k >= 1 && top_k < static_cast<float>(vocab) ? static_cast<int64_t>(top_k) : vocab;
  }
};

// A row of params: p[column * stride].
MICROLLM_HD inline RowParams row_params(const float* p, int64_t stride) {
  RowParams r;
  r.temperature = p[kTemperature * stride];
  r.top_k = p[kTopK * stride];
  r.top_p = p[kTopP * stride];
  r.min_p = p[kMinP * stride];
  r.repetition_penalty = p[kRepetitionPenalty * stride];
  r.presence_penalty = p[kPresencePenalty * stride];
  r.frequency_penalty = p[kFrequencyPenalty * stride];
  r.logit_bias = p[kLogitBias * stride];
  return r;
}

// The logit of a token with bias `bias` (0 for a row without one) seen `count` times (count <= 0: unseen), as
// the order below compares it. NaN becomes -inf and -0 becomes +0, so that the order is a plain comparison of
// keys.
MICROLLM_HD inline float adjusted(float x, float bias, int32_t count, const RowParams& p) {
  x = MICROLLM_FADD_RN(x, bias);
  if (x != x) x = -INFINITY;
  if (count > 0) {
    x = x > 0 ? MICROLLM_FDIV_RN(x, p.repetition_penalty) : MICROLLM_FMUL_RN(x, p.repetition_penalty);
    const float penalty =
        MICROLLM_FADD_RN(p.presence_penalty, MICROLLM_FMUL_RN(p.frequency_penalty, static_cast<float>(count)));
    x = MICROLLM_FADD_RN(x, -penalty);
  }
  return x == 0 ? 0.0f : x;
}

// A candidate's place in the order as one u64 that sorts ascending: the high half is the logit's bits mapped
// to descending order, the low half the id (so equal logits put the lower id first). Every key is unique.
MICROLLM_HD inline uint64_t rank_key(float x, int64_t id) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}
MICROLLM_HD inline int32_t key_id(uint64_t key) { return static_cast<int32_t>(static_cast<uint32_t>(key)); }
MICROLLM_HD inline float key_logit(uint64_t key) {
  const uint32_t ascending = ~static_cast<uint32_t>(key >> 32);
  const uint32_t bits = (ascending & 0x80000000u) ? (ascending & 0x7FFFFFFFu) : ~ascending;
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

constexpr uint32_t kMaxWeight = 0x80000000u;  // 2^31: the weight of the largest logit
// Below this z = (x - max) / T, 2^31 e^z < 1.09 would truncate to 0 or 1: such tokens weigh exactly 0, so
// "weighs more than 0" is a threshold on the logit and the weighted candidates are a prefix of the order.
constexpr float kMinExponent = -21.4f;

// trunc(2^31 e^z) for z <= 0, the same bits on every device: e^z = 2^n e^r with n = rint(z / ln 2) and
// |r| <= ln 2 / 2 (Cody-Waite: ln 2 = 0.693359375 - 2.12194440e-4, the first part exact in n * part), e^r by its
// Taylor series to r^7 (relative error < 6e-9), 2^(n + 31) by ldexp (exact).
MICROLLM_HD inline uint32_t weight_of_exponent(float z) {
  if (!(z >= kMinExponent)) return 0;  // also NaN
  if (z >= 0) return kMaxWeight;
  const float n = rintf(MICROLLM_FMUL_RN(z, 1.44269504f));
  float r = MICROLLM_FADD_RN(z, MICROLLM_FMUL_RN(n, -0.693359375f));
  r = MICROLLM_FADD_RN(r, MICROLLM_FMUL_RN(n, 2.12194440e-4f));
  float e = 1.0f / 5040.0f;  // Horner from r^7 down
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f / 720.0f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f / 120.0f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f / 24.0f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f / 6.0f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 0.5f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f);
  e = MICROLLM_FADD_RN(MICROLLM_FMUL_RN(e, r), 1.0f);
  const float scaled = ldexpf(e, static_cast<int>(n) + 31);
  return scaled >= 2147483648.0f ? kMaxWeight : static_cast<uint32_t>(scaled);
}

// The weight of logit x in a row whose largest logit is `max`. The largest always weighs 2^31, also when it
// is infinite (then every other token weighs 0).
MICROLLM_HD inline uint32_t weight(float x, float max, float temperature) {
  if (x == max) return kMaxWeight;
  return weight_of_exponent(MICROLLM_FDIV_RN(MICROLLM_FADD_RN(x, -max), temperature));
}

// min-p: a candidate below min_p times the largest weight (2^31) ends the kept prefix.
MICROLLM_HD inline bool below_min_p(uint32_t w, const RowParams& p) {
  return p.min_p > 0 && static_cast<double>(w) < static_cast<double>(p.min_p) * 2147483648.0;
}
// top-p: the prefix whose running weight `cumulative` has reached top_p of `total` is long enough.
MICROLLM_HD inline bool reaches_top_p(uint64_t cumulative, uint64_t total, const RowParams& p) {
  return static_cast<double>(cumulative) >= static_cast<double>(p.top_p) * static_cast<double>(total);
}
MICROLLM_HD inline bool top_p_on(const RowParams& p) { return p.top_p < 1; }
// The draw: the first candidate whose running weight exceeds u * kept.
MICROLLM_HD inline double draw_target(float u, uint64_t kept) {
  return static_cast<double>(u) * static_cast<double>(kept);
}
MICROLLM_HD inline bool passes_target(uint64_t cumulative, double target) {
  return static_cast<double>(cumulative) > target;
}

// The uniform of draw number `offset` of a row seeded `seed`: uniform_from_bits(philox4x32(seed, 0, offset)[0])
// of core/random.h (24 bits, exact in f32), repeated here so that device code can call it.
MICROLLM_HD inline float draw_uniform(uint64_t seed, uint64_t offset) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c[4] = {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t next0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t next2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[1] = static_cast<uint32_t>(p1);
    c[3] = static_cast<uint32_t>(p0);
    c[0] = next0;
    c[2] = next2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return static_cast<float>(c[0] >> 8) * (1.0f / 16777216.0f);
}

// Where a row's bias and counts are: bias[v * bias_stride] is token v's logit bias (nullptr: none),
// counts[v * counts_stride] how often token v was seen (nullptr: no penalties).
struct RowState {
  const float* bias = nullptr;
  int64_t bias_stride = 0;
  const int32_t* counts = nullptr;
  int64_t counts_stride = 0;
};

// The reference: the next token of one row. x holds the row's logits as f32 and is overwritten with the
// adjusted ones; u in [0, 1); keys is scratch.
inline int32_t sample_row(std::span<float> x, const RowState& state, const RowParams& p, float u,
                          std::vector<uint64_t>& keys) {
  const auto vocab = static_cast<int64_t>(x.size());
  uint64_t first = UINT64_MAX;
  for (int64_t v = 0; v < vocab; ++v) {
    float& xv = x[static_cast<size_t>(v)];
    xv = adjusted(xv, state.bias != nullptr ? state.bias[v * state.bias_stride] : 0.0f,
                  state.counts != nullptr ? state.counts[v * state.counts_stride] : 0, p);
    first = std::min(first, rank_key(xv, v));
  }
  if (p.greedy()) return key_id(first);
  const float max = key_logit(first);
  // The candidates that weigh anything, sorted: a prefix of the order (kMinExponent), the rest never drawn.
  keys.clear();
  for (int64_t v = 0; v < vocab; ++v) {
    const float xv = x[static_cast<size_t>(v)];
    if (weight(xv, max, p.temperature) > 0) keys.push_back(rank_key(xv, v));
  }
  std::sort(keys.begin(), keys.end());
  auto w = [&](size_t i) { return weight(key_logit(keys[i]), max, p.temperature); };
  const size_t n = std::min(keys.size(), static_cast<size_t>(p.top_k_limit(vocab)));
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += w(i);
  size_t keep = n;
  for (size_t i = 1; i < n && p.min_p > 0; ++i) {
    if (below_min_p(w(i), p)) {
      keep = i;
      break;
    }
  }
  uint64_t kept = 0;
  for (size_t i = 0; i < keep; ++i) {
    kept += w(i);
    if (top_p_on(p) && reaches_top_p(kept, total, p)) {
      keep = i + 1;
      break;
    }
  }
  const double target = draw_target(u, kept);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += w(i);
    if (passes_target(cumulative, target)) return key_id(keys[i]);
  }
  return key_id(keys[keep - 1]);  // unreachable: u < 1 puts the target below the kept weight
}

}  // namespace microllm::sampling
