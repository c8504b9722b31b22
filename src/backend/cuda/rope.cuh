// The rotary embedding's arithmetic on the device, shared by rope.cu and the fused decode attention
// (paged_attention.cu), so the two give the same bits (internal header).
#pragma once

#include <algorithm>
#include <vector>

#include "common.cuh"
#include "microllm/backend/rope_math.h"

namespace microllm::cuda_kernels::rotary {

// The D / 2 inverse frequencies (rope_math.h's, computed on the host) by value as a kernel argument, for head
// dims up to 2 N.
template <typename A, int N>
struct InvFreq {
  A v[N];
};

// params' inverse frequencies for head_dim; head_dim <= 2 N is the caller's to check.
template <typename A, int N>
InvFreq<A, N> inv_freq_arg(const RopeParams& params, int64_t head_dim) {
  InvFreq<A, N> freq{};
  const std::vector<A> values = rope_inv_freq_as<A>(params, head_dim);
  std::copy(values.begin(), values.end(), freq.v);
  return freq;
}

// Products rounded on their own, never contracted into an FMA with the add or subtract next to them:
// the CPU reference computes a * cos - c * sin as two rounded products and a difference.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ void sin_cos(float x, float* s, float* c) { sincosf(x, s, c); }
__device__ __forceinline__ void sin_cos(double x, double* s, double* c) { sincos(x, s, c); }

// The sine and cosine of the angle position * inv_freq (the product rounded on its own).
template <typename A>
__device__ __forceinline__ void angle_sin_cos(A position, A inv_freq, A* sn, A* cs) {
  sin_cos(mul_rn(position, inv_freq), sn, cs);
}

// Pair (a, c) turned by the angle: (a cos - c sin, c cos + a sin).
template <typename A>
__device__ __forceinline__ void turn(A a, A c, A cs, A sn, A& first, A& second) {
  first = mul_rn(a, cs) - mul_rn(c, sn);
  second = mul_rn(c, cs) + mul_rn(a, sn);
}

}  // namespace microllm::cuda_kernels::rotary
