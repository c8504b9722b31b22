// Phases 1 and 3 of the paged decode attention's staged kernels (paged_kernels.cuh: attend_staged_keys) on the
// tensor cores, for a CTA of 8 query rows (one GQA group of up to 8 heads) over keys staged in shared memory as
// rows of `pitch` elements (a pitch of D + 8 puts the 8 rows one ldmatrix reads on 8 different bank groups).
// T is bf16 or f16, kDim a multiple of 16. Internal header; the fragment layouts are attention_mma.cuh's.
//
// Why: the CUDA-core phases give every thread of a 128-key split a whole key (8 rows x D multiply-adds, its
// queries broadcast from shared memory) and then 8 rows x 8 dims of P V a lane, summed over the warp by shuffles;
// over a few hundred keys a CTA they cost more than the split's data movement (docs/perf/inference.md). As
// mma.m16n8k16 the 8 rows are exactly one n8 tile: a 16-key tile's scores are D / 16 MMAs.
//
// Precision: the queries in sq are f32 holding T-rounded values, so converting them back to T is exact, and the
// score products are exact in f32. P is split into two T terms, p = hi + lo (lo = T(p - hi)), so P V carries
// about 16 bits of p (bf16; 22 for f16) rather than T's 8: the output is rounded to T once, at the end, as on the
// CUDA cores. The sums run in the tensor cores' order, so the bits differ from the CUDA-core phases' (and from a
// CTA of one query row) in the last places.
#pragma once

#include <cmath>
#include <type_traits>

#include "attention_mma.cuh"
#include "common.cuh"

namespace microllm::cuda_kernels::decode_phases {

template <typename T, int R, int kDim>
constexpr bool kStagedOnTensorCores = R == 8 && kDim > 0 && kDim % 16 == 0 &&
                                      (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);

// Phase 1: sc [8][chunk] = scale * Q K^T for keys [0, nk), as S^T = K Q^T: A = a 16-key tile of sk (row-major,
// k = dims), B = Q^T (the n8 tile: query row g's dims 2t.. of each 16-dim step), one MMA a 16-dim step. Warp w
// takes key tiles w, w + kWarps, ... A masked key (bad[jj]) or a row past nr scores -inf. Keys past nk are read
// (stale shared memory) but their scores are never stored: an MMA's outputs do not mix rows of A.
template <typename T, int kDim, int kWarps>
__device__ __forceinline__ void scores_mma(const T* sk, int pitch, const float* sq, int nk, int chunk, int nr,
                                           float scale, const int* bad, float* sc) {
  constexpr int kSteps = kDim / 16;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  uint32_t qb[kSteps][2];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const float2 lo = *reinterpret_cast<const float2*>(sq + g * kDim + s * 16 + 2 * t);
    const float2 hi = *reinterpret_cast<const float2*>(sq + g * kDim + s * 16 + 8 + 2 * t);
    qb[s][0] = attn::pack2<T>(lo.x, lo.y);
    qb[s][1] = attn::pack2<T>(hi.x, hi.y);
  }
  const uint32_t lane_addr = attn::smem_u32(sk + attn::a_lane_row(lane) * pitch + attn::a_lane_chunk(lane) * 8);
  for (int tile = warp; tile * 16 < nk; tile += kWarps) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t tile_addr = lane_addr + static_cast<uint32_t>(tile * 16 * pitch * sizeof(T));
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      uint32_t a[4];
      attn::ldsm_x4(a, tile_addr + s * 32);  // dims s * 16 .. + 16: two 16-byte chunks
      attn::mma_16816<T>(acc, a, qb[s][0], qb[s][1]);
    }
    // acc: (key g, rows 2t, 2t + 1), (key g + 8, rows 2t, 2t + 1) of the tile
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int jj = tile * 16 + g + 8 * half;
      if (jj >= nk) continue;
      const bool valid = !bad[jj];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = 2 * t + c;
        sc[r * chunk + jj] = valid && r < nr ? acc[2 * half + c] * scale : -INFINITY;
      }
    }
  }
}

// p's two T terms for the B operand: hi = T(p), lo = T(p - hi), packed in pairs (the lower key in the low half).
template <typename T>
__device__ __forceinline__ void split_pair(float p0, float p1, uint32_t& hi, uint32_t& lo) {
  hi = attn::pack2<T>(p0, p1);
  const T* h = reinterpret_cast<const T*>(&hi);
  lo = attn::pack2<T>(p0 - to_acc(h[0]), p1 - to_acc(h[1]));
}

// Phase 3: o_r = sum_j p_rj v_j for keys [0, nk), as O^T [D][8] = V^T P^T: A = a 16-dim x 16-key block of V^T,
// loaded transposed from sv [keys][pitch]; B = P^T from sc [8][chunk] (0 past nk). V's rows from nk up to the next
// multiple of 16 must hold finite values (the caller zeroes them: 0 x NaN would poison a whole dim). Warp w takes
// key steps w, w + kWarps, ... and leaves its sums in red [kWarps][8][kDim] (which may alias sk and sv: the barrier
// before the stores keeps them apart), so o_r[d] = sum over w of red[(w * 8 + r) * kDim + d], published by a final
// barrier. Every thread of the CTA must call it.
template <typename T, int kDim, int kWarps>
__device__ __forceinline__ void accumulate_pv_mma(const T* sv, int pitch, const float* sc, int chunk, int nk,
                                                  float* red) {
  constexpr int kTiles = kDim / 16, R = 8;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  float acc[kTiles][4];
#pragma unroll
  for (int m = 0; m < kTiles; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
  const uint32_t lane_addr = attn::smem_u32(sv + attn::nk_lane_row(lane) * pitch + attn::nk_lane_chunk(lane) * 8);
  for (int step = warp; step * 16 < nk; step += kWarps) {
    const int k0 = step * 16;
    // B: row g's p at keys k0 + 2t, +1 (b0) and k0 + 8 + 2t, +1 (b1)
    auto p_at = [&](int jj) { return jj < nk ? sc[g * chunk + jj] : 0.f; };
    uint32_t hi0, lo0, hi1, lo1;
    split_pair<T>(p_at(k0 + 2 * t), p_at(k0 + 2 * t + 1), hi0, lo0);
    split_pair<T>(p_at(k0 + 8 + 2 * t), p_at(k0 + 9 + 2 * t), hi1, lo1);
    const uint32_t step_addr = lane_addr + static_cast<uint32_t>(k0 * pitch * sizeof(T));
#pragma unroll
    for (int m = 0; m < kTiles; ++m) {
      uint32_t a[4];
      attn::ldsm_x4_trans(a, step_addr + m * 32);  // dims m * 16 .. + 16
      attn::mma_16816<T>(acc[m], a, hi0, hi1);
      attn::mma_16816<T>(acc[m], a, lo0, lo1);
    }
  }
  __syncthreads();  // the staged rows are dead: red overwrites them
  // acc[m]: (dim m * 16 + g, rows 2t, 2t + 1), (dim m * 16 + g + 8, rows 2t, 2t + 1)
  float* own = red + warp * R * kDim;
#pragma unroll
  for (int m = 0; m < kTiles; ++m) {
    const int d = m * 16 + g;
    own[(2 * t) * kDim + d] = acc[m][0];
    own[(2 * t + 1) * kDim + d] = acc[m][1];
    own[(2 * t) * kDim + d + 8] = acc[m][2];
    own[(2 * t + 1) * kDim + d + 8] = acc[m][3];
  }
  __syncthreads();
}

}  // namespace microllm::cuda_kernels::decode_phases
