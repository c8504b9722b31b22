// The per-CTA phases of split-K decode attention, shared by the contiguous KV cache's kernel
// (attention_decode.cu) and the paged one (paged_attention.cu); internal header. A CTA owns R query rows (the
// query heads of one kv head) and one chunk of keys; the kernels differ only in where a key's K and V rows
// live, which they pass in as pointers. The rows' queries are f32 in shared memory (sq [R][D]); scores and
// then probabilities in sc [R][chunk].
#pragma once

#include <cmath>

#include "common.cuh"

namespace microllm::cuda_kernels::decode_phases {

// Phase 1, one key: acc[r] = q_r . k over D (a multiple of 8), the K row read in 16-byte loads, the queries
// broadcast from shared memory (every thread reads the same address).
template <int R, typename T>
__device__ __forceinline__ void dot_rows(const T* k_row, const float* sq, int D, float (&acc)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int d0 = 0; d0 < D; d0 += 8) {
    float kx[8];
    load8(k_row + d0, kx);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4 qa = *reinterpret_cast<const float4*>(sq + r * D + d0);
      const float4 qb = *reinterpret_cast<const float4*>(sq + r * D + d0 + 4);
      acc[r] += qa.x * kx[0] + qa.y * kx[1] + qa.z * kx[2] + qa.w * kx[3] + qb.x * kx[4] + qb.y * kx[5] +
                qb.z * kx[6] + qb.w * kx[7];
    }
  }
}

// Phase 2: per row (a warp each) the chunk's max m and sum l of exp(s - m); the scores in sc become
// probabilities p = exp(s - m), 0 for a masked score (-inf), so a row that sees nothing has m = -inf, l = 0.
template <int R>
__device__ __forceinline__ void softmax_rows(float* sc, int chunk, int keys, float* sm, float* sl, int warps) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  for (int r = warp; r < R; r += warps) {
    float m = -INFINITY;
    for (int jj = lane; jj < keys; jj += 32) m = fmaxf(m, sc[r * chunk + jj]);
    m = warp_max(m);
    float l = 0.f;
    for (int jj = lane; jj < keys; jj += 32) {
      const float s = sc[r * chunk + jj];
      const float p = s == -INFINITY ? 0.f : expf(s - m);
      sc[r * chunk + jj] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      sm[r] = m;
      sl[r] = l;
    }
  }
}

// Phase 3: o_r = sum_j p_rj v_j. Thread tid owns dims (tid % (D/8)) * 8 .. +8 and keys tid / (D/8) + i * slices;
// v_row(jj) is key jj's V row (null: skip the key, its p is 0). The slices' partial sums land in
// red [slices][R][D] (which may alias sc: the barrier in between keeps them apart), so o_r[d] is
// sum over s of red[(s * R + r) * D + d]. Every thread of the CTA must call it.
template <int R, int kThreads, typename T, typename VRow>
__device__ __forceinline__ void accumulate_pv(const float* sc, int chunk, int keys, int D, float* red, VRow v_row) {
  const int tid = static_cast<int>(threadIdx.x);
  const int dims8 = D / 8, slices = kThreads / dims8, dc = tid % dims8, ks = tid / dims8;
  float acc[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.f;
  if (ks < slices) {
    for (int jj = ks; jj < keys; jj += slices) {
      const T* v = v_row(jj);
      if (v == nullptr) continue;
      float vx[8];
      load8(v + dc * 8, vx);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float p = sc[r * chunk + jj];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] += p * vx[e];
      }
    }
  }
  __syncthreads();  // sc is dead; red overwrites the same space
  if (ks < slices) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(ks * R + r) * D + dc * 8 + e] = acc[r][e];
  }
  __syncthreads();
}

// The combine, one output row of `used` splits with stats (m_s, l_s) and partial sums part_o [split][D]:
// out[d] = sum_s w_s o_s[d] / sum_s w_s l_s with w_s = e^(m_s - max m), 0 when no split saw a key. w (shared,
// [used]) and scratch ([32]) are block workspace; returns (max m, the denominator) for a log-sum-exp. Every
// thread of the block must call it; it ends with a barrier, so w may be reused for the next row.
// Each split's m and l are loaded together (thread s: split s), so the denominator costs no second round trip to
// L2 after the max.
template <typename T>
__device__ __forceinline__ float2 combine_row(const float* m, const float* l, const float* part_o, int used, int D,
                                              float* w, float* scratch, T* out) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const bool first_own = tid < used;
  const float m_first = first_own ? m[tid] : -INFINITY, l_first = first_own ? l[tid] : 0.f;
  float mx = m_first;
  for (int s = tid + threads; s < used; s += threads) mx = fmaxf(mx, m[s]);
  mx = block_max(mx, scratch);
  float sum = 0.f;
  for (int s = tid; s < used; s += threads) {
    const float ms = s == tid ? m_first : m[s], ls = s == tid ? l_first : l[s];
    const float ws = mx == -INFINITY || ms == -INFINITY ? 0.f : expf(ms - mx);
    w[s] = ws;
    sum += ws * ls;
  }
  sum = block_sum(sum, scratch);  // its barriers also publish w
  for (int d = tid; d < D; d += threads) {
    float acc = 0.f;
    if (sum > 0.f) {
      for (int s = 0; s < used; ++s) acc += w[s] * part_o[s * D + d];
      acc /= sum;
    }
    out[d] = from_acc<T>(acc);
  }
  __syncthreads();  // w is rewritten for the next row
  return make_float2(mx, sum);
}

}  // namespace microllm::cuda_kernels::decode_phases
