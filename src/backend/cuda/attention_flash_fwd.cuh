// The flash attention forward's shared parts (internal header): the kernels' arguments, the causal extent of a
// query block, the split-keys plan, the kernel that merges split rows, and the launch that ties them together.
// Two kernels use them: the portable one on mma.sync (attention_flash_fwd.cu, any sm_80+ GPU; the one a HIP
// port keeps) and the Hopper one on wgmma (attention_flash_fwd_sm90.cu, H100/H200), which flash_forward
// prefers where it runs.
#pragma once

#include <algorithm>
#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"
#include "common.cuh"

namespace microllm::cuda_kernels::attention::flash_fwd {

using attn::pack2;

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;                                      // [B, Hq, T, D] at out_stride (from ops: token-major)
  float* lse;                                     // [B, Hq, T] contiguous
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, head, position (elements); dim stride is 1
  int64_t out_stride[3];                          // the same for out, each row 16-byte aligned
  int q_heads, group, q_len, kv_len, q_offset;
  int window;  // > 0: query i sees keys j > q_offset + i - window too (causal only)
  bool causal;
  float scale_log2;  // scale * log2(e)
  // Split keys (attention_flash_fwd.cu's header comment); chunk_tiles 0: one CTA per query block, no partials.
  int chunk_tiles;  // key tiles per split
  int n_split;      // splits of the longest block: the partials' stride
  int split_row0;   // first row of the first block that splits (later blocks split too: kv_end grows)
  int split_rows;   // q_len - split_row0
  float* part_o;    // [B * Hq][split_rows][n_split][D], sum_j p_j v_j with p = 2^(s_j - m)
  float2* part_ml;  // [B * Hq][split_rows][n_split]: (m in natural-log units, sum_j p_j)
};

// Keys that query block [q0, q0 + rows) reads: up to its last row's diagonal when causal (>= 1: key 0 is
// always visible). One formula for the host's split plan and both kernels.
MICROLLM_HD inline int block_kv_end(const FwdArgs& a, int q0, int rows) {
  const int q_last = (q0 + rows < a.q_len ? q0 + rows : a.q_len) - 1;
  const int causal_end = a.q_offset + q_last + 1;
  return a.causal && causal_end < a.kv_len ? causal_end : a.kv_len;
}

// The first key query block [q0, ...) reads: 0, or under a sliding window the first key its first row sees.
MICROLLM_HD inline int block_kv_begin(const FwdArgs& a, int q0) {
  const int first = a.q_offset + q0 - a.window + 1;
  return a.window > 0 && first > 0 ? first : 0;
}

// Query block [q0, q0 + rows)'s key tiles of width bc: [first, end).
struct TileRange {
  int first, end;
};
MICROLLM_HD inline TileRange block_tiles(const FwdArgs& a, int q0, int rows, int bc) {
  return {block_kv_begin(a, q0) / bc, (block_kv_end(a, q0, rows) + bc - 1) / bc};
}

// The key tiles [begin, end) of width BC that this CTA reads: query block [q0, q0 + rows) reads all its tiles, or,
// when its keys split, split blockIdx.z's chunk of them (attention_flash_fwd.cu's header comment), which then
// writes a partial. begin >= end: nothing to do (a split past this block's keys).
struct CtaTiles {
  int begin, end;
  bool partial;
};
template <int BC>
__device__ __forceinline__ CtaTiles cta_tiles(const FwdArgs& a, int q0, int rows) {
  const TileRange t = block_tiles(a, q0, rows, BC);
  const bool partial = a.chunk_tiles > 0 && t.end - t.first > a.chunk_tiles;
  const int end = partial ? t.end - static_cast<int>(blockIdx.z) * a.chunk_tiles : t.end;
  if (end <= t.first || (!partial && blockIdx.z > 0)) return {0, 0, false};
  return {partial ? max(t.first, end - a.chunk_tiles) : t.first, end, partial};
}

// Whether key tile [key0, key0 + bc) needs the mask for query rows [row_lo, row_hi]: it reaches past the keys or
// the diagonal of row_lo, or under a window its first key is hidden from row_hi.
MICROLLM_HD inline bool tile_needs_mask(const FwdArgs& a, int key0, int bc, int row_lo, int row_hi) {
  return key0 + bc > a.kv_len || (a.causal && key0 + bc - 1 > a.q_offset + row_lo) ||
         (a.window > 0 && key0 <= a.q_offset + row_hi - a.window);
}
// Whether query row `row` sees key `col`.
MICROLLM_HD inline bool key_visible(const FwdArgs& a, int row, int col) {
  return col < a.kv_len && sees_key(a.causal, a.q_offset, a.window, row, col);
}

// A row's total over the four lanes (threadID_in_group) that hold its columns of a C fragment.
__device__ __forceinline__ float quad_sum(float v) {
  v += MICROLLM_SHFL_XOR(v, 1);
  return v + MICROLLM_SHFL_XOR(v, 2);
}

constexpr float kLn2 = 0.69314718055994531f;

// Writes query row `row`'s partial of this split (CTA blockIdx.z) for flash_combine_kernel: (max in natural-log
// units, sum) from the row's first lane, and this lane's O columns 8 j + 2 t4 and + 1 (j < D / 8), which o(j, e)
// gives. m_log2 is the row's running max in log2 units, l its sum over the four lanes.
template <int D, typename Columns>
__device__ __forceinline__ void write_split_partial(const FwdArgs& a, int row, float m_log2, float l, int t4,
                                                    Columns o) {
  const int64_t slot =
      (static_cast<int64_t>(blockIdx.x) * a.split_rows + (row - a.split_row0)) * a.n_split + blockIdx.z;
  if (t4 == 0) a.part_ml[slot] = make_float2(l > 0.f ? m_log2 * kLn2 : -INFINITY, l);
  float* o_row = a.part_o + slot * D;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) *reinterpret_cast<float2*>(o_row + j * 8 + 2 * t4) = make_float2(o(j, 0), o(j, 1));
}

// A row's log-sum-exp in natural-log units from its max (log2 units) and sum; -inf for a row that saw no key.
__device__ __forceinline__ float row_lse(float m_log2, float l) {
  return l > 0.f ? (m_log2 + log2f(l)) * kLn2 : -INFINITY;
}

// Row `row` of head h of batch b in out.
template <typename T>
__device__ __forceinline__ T* out_row(const FwdArgs& a, int64_t b, int64_t h, int64_t row) {
  return static_cast<T*>(a.out) + b * a.out_stride[0] + h * a.out_stride[1] + row * a.out_stride[2];
}

// Merges the splits of one row per warp (rows of the blocks that split, [B * Hq][split_rows]; partial rows of D
// columns, the first DV of them the output's):
// out = sum_s w_s o_s / sum_s w_s l_s with w_s = e^(m_s - max m), lse = max m + log(sum); splits that saw
// no key (l = 0) weigh nothing, and a row that saw none gets 0 and -inf, as the unsplit kernel writes.
template <typename T, int D, int BR, int BC, int DV = D>
__global__ void __launch_bounds__(256) flash_combine_kernel(const FwdArgs a, int64_t rows) {
  wait_for_prior_grids();  // the partials come from the kernel before (chained in a captured prefill)
  constexpr int E = D / 32;  // elements per lane
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (w >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = w / a.split_rows;
  const int row = a.split_row0 + static_cast<int>(w % a.split_rows);
  const TileRange t = block_tiles(a, row / BR * BR, BR, BC);
  if (t.end - t.first <= a.chunk_tiles) return;  // this block did not split: the kernel wrote its rows
  const int used = (t.end - t.first + a.chunk_tiles - 1) / a.chunk_tiles;
  const float2* ml = a.part_ml + w * a.n_split;

  float mx = -INFINITY;
  for (int s = lane; s < used; s += 32) {
    if (ml[s].y > 0.f) mx = fmaxf(mx, ml[s].x);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, MICROLLM_SHFL_XOR(mx, off));
  float sum = 0.f, acc[E] = {};
  for (int s = 0; s < used; ++s) {
    const float2 st = ml[s];
    if (!(st.y > 0.f)) continue;
    const float ws = expf(st.x - mx);
    sum += ws * st.y;
    const float* o = a.part_o + (w * a.n_split + s) * D + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += ws * o[e];
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  T* out = out_row<T>(a, bh / a.q_heads, bh % a.q_heads, row) + lane * E;
  static_assert(DV % E == 0, "whole lanes of output");
  if (lane * E < DV) {
#pragma unroll
    for (int e = 0; e < E; e += 2) *reinterpret_cast<uint32_t*>(out + e) = pack2<T>(acc[e] * inv, acc[e + 1] * inv);
  }
  if (lane == 0) a.lse[bh * a.q_len + row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

// The split plan (attention_flash_fwd.cu's header comment): a chunk near one slot's share of the key tiles of all
// blocks, never under kMinChunkKeys keys (each split adds a partial row to write and merge); no split unless the
// longest block is well over that share.
constexpr int kMinChunkKeys = 256;

inline void split_plan(FwdArgs& a, int64_t bh, int rows, int tile_keys, int64_t slots) {
  a.chunk_tiles = 0;
  const int n_blocks = (a.q_len + rows - 1) / rows;
  int64_t total = 0;
  int longest = 0;
  auto tiles_of = [&](int block) {
    const TileRange t = block_tiles(a, block * rows, rows, tile_keys);
    return t.end - t.first;
  };
  for (int i = 0; i < n_blocks; ++i) {
    const int tiles = tiles_of(i);
    total += tiles;
    longest = std::max(longest, tiles);
  }
  const int64_t share = (bh * total + slots - 1) / slots;
  const int chunk = static_cast<int>(std::max<int64_t>(share, (kMinChunkKeys + tile_keys - 1) / tile_keys));
  if (2 * longest <= 3 * share || longest <= chunk) return;
  // The partials cover the rows from the first block that splits. Without a window every later block splits too
  // (its keys end later); under one a short last block may not, and the combine skips its rows.
  int first = 0;
  while (tiles_of(first) <= chunk) ++first;
  a.chunk_tiles = chunk;
  a.n_split = (longest + chunk - 1) / chunk;
  a.split_row0 = first * rows;
  a.split_rows = a.q_len - a.split_row0;
}

// Launches the forward (a CTA per batch x query head x block of ROWS query rows, grid.z the splits) under the
// split plan for `ctas_per_sm` resident CTAs an SM, then merges the rows of the blocks that split.
// launch_main(grid) launches the kernel itself (its parameters are the kernel's own; `a` as planned here).
template <typename T, int D, int ROWS, int BC, int DV = D, typename LaunchMain>
void launch_split(LaunchMain launch_main, int ctas_per_sm, FwdArgs& a, int64_t batch, cudaStream_t stream, int device) {
  const int64_t bh = batch * a.q_heads;
  split_plan(a, bh, ROWS, BC, int64_t{multiprocessor_count(device)} * ctas_per_sm);
  Tensor part_o, part_ml;
  if (a.chunk_tiles > 0) {
    const Device dev = Device::cuda(device);
    const int64_t partial_rows = bh * a.split_rows * a.n_split;
    part_o = Tensor::empty({partial_rows * D}, DType::f32, dev);
    part_ml = Tensor::empty({partial_rows * 2}, DType::f32, dev);
    a.part_o = part_o.data<float>();
    a.part_ml = reinterpret_cast<float2*>(part_ml.data<float>());
  }
  launch_main(dim3(static_cast<unsigned>(bh), static_cast<unsigned>((a.q_len + ROWS - 1) / ROWS),
                   static_cast<unsigned>(a.chunk_tiles > 0 ? a.n_split : 1)));
  if (a.chunk_tiles > 0) {
    const int64_t rows = bh * a.split_rows;
    launch_chained(flash_combine_kernel<T, D, ROWS, BC, DV>, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream,
                   device, a, rows);
  }
}
// The same for a kernel whose only parameter is FwdArgs, launched chained (common.cuh): in a captured prefill
// each starts while the kernel before it finishes.
template <typename T, int D, int ROWS, int BC, int DV = D>
void launch_split(void (*kernel)(FwdArgs), int threads, int smem_bytes, int ctas_per_sm, FwdArgs& a, int64_t batch,
                  cudaStream_t stream, int device) {
  launch_split<T, D, ROWS, BC, DV>(
      [&](dim3 grid) { launch_chained(kernel, grid, threads, smem_bytes, stream, device, a); }, ctas_per_sm, a, batch,
      stream, device);
}

// The Hopper kernel's launch (attention_flash_fwd_sm90.cu; D 64 or 128), where flash_forward_uses_wgmma says it
// runs.
void launch_sm90(FwdArgs& a, int64_t batch, int head_dim, bool bf16, cudaStream_t stream, int device);

}  // namespace microllm::cuda_kernels::attention::flash_fwd
