// The paged KV cache's attention kernels (include/microllm/ops/paged_attention.h), device side: their
// arguments and the kernels. Included by paged_attention.cu only, which plans and launches them.
//
// Every per-step value (slots, block tables, seq ids, positions) is read on the device, and every launch
// shape depends only on what the host knows (N, the heads, D, max_context, the pools' shape), so a decode
// step captured in a CUDA graph replays correctly with new values in the same buffers. Bad values never
// cause an out-of-bounds access: the kernels skip the row / key / block and report it through the device
// error word (IndexError at the next synchronization).
//
// paged_attention, fast path (f32/f16/bf16, D a power of two 16..256, pool rows 16-byte aligned): split-K
// flash-decoding with the keys found through the block table.
//   staged kernel: grid (token x kv head x row block, split). The rows of a CTA are up to 8 query heads of
//     ONE kv head of one token, so every K/V row read serves the whole GQA group. A CTA resolves its token
//     (position, sequence; a padding row or a split past the sequence's length exits at once, which keeps a
//     graph sized for max_context cheap while sequences are short), then stages its chunk's K and V rows in
//     shared memory with cp.async, every copy in flight at once (one DRAM round trip, not one per key), then:
//     scores (a thread per key), chunk max and sum (a warp per row), o = sum p v (a thread per 8-dim slice and
//     key slice, summed over the warp's key slices with shuffles, then over warps in shared memory); a CTA of 8
//     rows in bf16/f16 computes the scores and o on the tensor cores instead (decode_mma.cuh). With one
//     split it writes out directly (o / l); otherwise (m, l, o) per row and split in f32.
//   combine kernel (more than one split): one block per query row merges the splits that ran:
//     out = sum o_s e^(m_s - M) / sum l_s e^(m_s - M).
// Up to max_context <= one chunk (256 keys at D 64 in bf16) there is one split and no combine kernel; past
// it the chunk (64..256 keys) is chosen from max_context so that the grid gives about one CTA per SM.
// paged_decode_attention runs the same kernel with the decode step's work folded in: the CTA turns its
// queries by the rotary embedding as it loads them, and the CTA whose chunk holds the token's own position
// turns the new key, puts it and the new value straight into its staged rows (no round trip through the
// pool) and (for the first row block) writes both to the token's slot. Rotations and roundings are those of
// rope.cu, so the fused step gives the same bits as rope + paged_kv_write + paged_attention. Launched chained
// in a decode graph, it stages the cached rows before it waits for the kernel before (the qkv projection).
// paged_decode_attention_projected adds the attention's output projection to that kernel where a token's query
// heads fit one thread-block cluster (one query head per CTA, one split, at most 2 tokens, 64 KB of o_weight rows
// a CTA in shared memory or 128 KB through L2: Qwen2.5-0.5B's batch-1/2 steps up to 256 keys): the heads' outputs
// meet through the cluster's shared memory and each CTA computes its share of the columns (kProject below; at
// batch 1 four clusters a token each compute the attention and a quarter of the columns). Past one split (a
// longer context) up to 2,048 keys (for 2 kv heads), a token's whole attention and its projection run in one
// cluster of kv heads x slices CTAs (paged_token_cluster_kernel: each CTA one slice of the keys for a kv head's
// query heads, the slices merged through the cluster's shared memory). One token past that, up to 4,096 keys, runs
// in kv_heads clusters of one kv head's 16 slices each (its kHeadClusters: each cluster projects its heads' part of
// the input, and the last to arrive at a column block's counter adds the parts). Past those, or where their budgets
// do not hold, the combine kernel does the projection instead (paged_combine_projected_kernel): clusters of a token's
// query heads, replicated like kProject's but repeating only the merge of the splits (up to 8 clusters a token
// within the SMs, rows in shared memory; one cluster streaming rows through L2 where 64 KB a CTA cannot hold
// them); elsewhere the o GEMV runs after the attention.
// Other head dims or layouts take the simple kernel: a block per query row, online softmax over chunks
// of 128 keys, strided scalar loads (paged_decode_attention: the composition of the separate ops).
#pragma once

#include <cmath>

#include "../../core/cuda/device_errors.h"
#include "../paged_decode_plan.h"
#include "common.cuh"
#include "decode_mma.cuh"
#include "decode_phases.cuh"
#include "paged_projection.cuh"
#include "rms_math.cuh"
#include "rope.cuh"

namespace microllm::cuda_kernels::paged {
namespace {

using detail::DeviceErrorCode;
using detail::report_device_error;

// The launch constants the host's plan shares (paged_decode_plan.h).
using paged_plan::kMaxFastDim;
using paged_plan::kSimpleKeys;
using paged_plan::kSmallThreads;
using paged_plan::kStagedThreads;
using paged_plan::kStagedWarps;

// The rotary inverse frequencies (rope_math.h on the host), by value: paged_decode_attention only.
using RopeFreq = rotary::InvFreq<float, kMaxFastDim / 2>;

struct PagedArgs {
  const void* q;
  const void* k_pool;
  const void* v_pool;
  const int32_t* tables;
  const int32_t* seq_ids;
  const int32_t* positions;
  int64_t q_stride[3];  // token, head, dim
  int64_t k_stride[4];  // block, row, head, dim (the fast path needs dim stride 1)
  int64_t v_stride[4];
  int64_t table_stride[2];
  int64_t seq_stride, pos_stride;
  int q_heads, kv_heads, group, dim, block_size, num_blocks, num_seqs;
  int max_context;
  int window;  // > 0: a sliding window, a token attends to its `window` latest keys (first_key)
  float scale;
  int row_blocks;  // ceil(group / R), R the rows per CTA the staged launch chose
  int chunk, n_split;
  int pitch;        // elements per staged K/V row: D plus 16 bytes, so a warp's rows spread over the banks
  int stage_bytes;  // the staged rows' region (the cross-warp sums reuse it)
  float* part_o;    // [N * Hq][n_split][D]
  float* part_m;    // [N * Hq][n_split]
  float* part_l;
  void* out;  // [N, Hq, D] contiguous
  uint64_t* error_word;
  // paged_decode_attention: the new tokens' k, v before the rotation, and where they go.
  const void* k_new;
  const void* v_new;
  int64_t k_new_stride[3], v_new_stride[3];  // token, head, dim
  const int32_t* slots;
  int64_t slot_stride;
  int pair_step, partner;  // rotary pair i is dims (i * pair_step, i * pair_step + partner)
  // QK-norm (null: none): q's and the new k's heads normalized by these weights [D] before the rotation, as
  // qk_rms_norm's warp rows normalize them (rms_math.cuh), where a head is at most 32 16-byte packs.
  const void* q_norm_weight;
  const void* k_norm_weight;
  float norm_eps;
  // paged_decode_attention_projected (kProject): out [N, hidden] = addend + attention @ o_weight^T; `replicas`
  // clusters of q_heads CTAs per token (grid y: the replica), each cluster computing the token's attention and
  // CTA h of replica r columns [(r * q_heads + h) * o_cols, +o_cols) from its rows of o_weight [hidden, o_in].
  const void* o_weight;
  int64_t o_weight_stride;
  const void* addend;  // [N, hidden] contiguous, may be null
  void* proj_out;      // [N, hidden] contiguous
  int hidden, o_in, o_cols, replicas;
  int proj_offset;  // bytes of shared memory before the projection's region (16-byte aligned)
  // paged_token_cluster_kernel: each kv head's keys in `slices` slices, one CTA each (clusters of kv_heads x slices,
  // or with kHeadClusters of slices, kv_heads clusters a token).
  int slices;
  // kHeadClusters: each kv head's part of the projection, [N][kv_heads][hidden] f32, and an arrival counter a
  // column block (token, replica, rank), zero between launches (paged_attention.cu: arrival_counters).
  float* proj_partial;
  int* proj_counters;
};

// Token n's sequence, its position and how many of its keys to attend to (0: padding or a bad seq id ->
// output 0). `report` lets one thread per token report bad values.
struct Token {
  int seq, len, pos;
};
__device__ __forceinline__ Token resolve(const PagedArgs& a, int64_t n, bool report) {
  const int pos = a.positions[n * a.pos_stride];
  if (pos < 0) return {0, 0, pos};
  const int seq = a.seq_ids[n * a.seq_stride];
  if (seq < 0 || seq >= a.num_seqs) {
    if (report) report_device_error(a.error_word, DeviceErrorCode::paged_sequence, seq);
    return {0, 0, pos};
  }
  if (pos >= a.max_context) {  // the grid covers max_context keys: attend to those, and say so
    if (report) report_device_error(a.error_word, DeviceErrorCode::paged_position, pos);
    return {seq, a.max_context, pos};
  }
  return {seq, pos + 1, pos};
}

// The first key a token attends to: its window's (the `window` latest keys), else key 0. The splits and slices
// share the keys from here to tok.len.
__device__ __forceinline__ int first_key(const PagedArgs& a, const Token& tok) {
  return a.window > 0 ? max(0, tok.len - a.window) : 0;
}

// The block id of key j of sequence seq, or -1 when it is bad (reported).
__device__ __forceinline__ int key_block(const PagedArgs& a, int seq, int j, bool report) {
  const int block = a.tables[seq * a.table_stride[0] + static_cast<int64_t>(j / a.block_size) * a.table_stride[1]];
  if (block < 0 || block >= a.num_blocks) {
    if (report) report_device_error(a.error_word, DeviceErrorCode::paged_block, block);
    return -1;
  }
  return block;
}

// Element offset of key j's row (kv head hk) in a pool, or -1 when its block id is bad (reported).
__device__ __forceinline__ int64_t key_offset(const PagedArgs& a, const int64_t (&stride)[4], int seq, int j, int hk,
                                              bool report) {
  const int block = key_block(a, seq, j, report);
  if (block < 0) return -1;
  return block * stride[0] + static_cast<int64_t>(j % a.block_size) * stride[1] + hk * stride[2];
}

// Rotary pair (x1, x2) turned by the angle pos * inv_freq and rounded to T: rope.cu's arithmetic (rope.cuh).
template <typename T>
__device__ __forceinline__ void rotate_pair(float x1, float x2, float pos, float inv_freq, T& y1, T& y2) {
  float sn, cs, first, second;
  rotary::angle_sin_cos(pos, inv_freq, &sn, &cs);
  rotary::turn(x1, x2, cs, sn, first, second);
  y1 = from_acc<T>(first);
  y2 = from_acc<T>(second);
}

// ---- the staged kernels' phases (paged_staged_kernel, paged_token_cluster_kernel) ----

// Phase 0: the K and V rows of keys [c0, c0 + keys) of kv head hk of sequence seq into sk, sv [keys][pitch], every
// 16-byte copy in flight at once (cp.async; the caller waits). bad[jj] flags a key whose block id is bad: its rows
// become zeros, so its p = 0 never meets a NaN. `report`: this CTA reports bad block ids.
template <typename T>
__device__ __forceinline__ void stage_key_rows(const PagedArgs& a, int seq, int hk, int c0, int keys, int D, int pitch,
                                               T* sk, T* sv, int* bad, bool report) {
  constexpr int kPiece = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  const T* kp = static_cast<const T*>(a.k_pool);
  const T* vp = static_cast<const T*>(a.v_pool);
  const int pieces = D / kPiece;
  for (int p = threadIdx.x; p < keys * pieces; p += kStagedThreads) {
    const int jj = p / pieces, part = (p % pieces) * kPiece;
    T* kd = sk + jj * pitch + part;
    T* vd = sv + jj * pitch + part;
    const int block = key_block(a, seq, c0 + jj, part == 0 && report);
    if (part == 0) bad[jj] = block < 0;
    if (block < 0) {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const int64_t row = static_cast<int64_t>((c0 + jj) % a.block_size);
    copy16_async(kd, kp + block * a.k_stride[0] + row * a.k_stride[1] + hk * a.k_stride[2] + part);
    copy16_async(vd, vp + block * a.v_stride[0] + row * a.v_stride[1] + hk * a.v_stride[2] + part);
  }
}

// The fused decode step's queries: the nr rows from q (a row per query head) turned by the rotary embedding at
// position pos as rope.cu turns them, rounded to T, into sq [R][D] as f32 (rows past nr: 0). With QK-norm, a warp
// a row normalizes it into sq first, then turns it there.
template <typename T, int R>
__device__ __forceinline__ void load_rotated_queries(const PagedArgs& a, const RopeFreq& freq, const T* q, int nr,
                                                     float pos, int D, float* sq) {
  const int half = D / 2;
  if (a.q_norm_weight != nullptr) {
    const int lane = threadIdx.x % 32;
    const T* weight = static_cast<const T*>(a.q_norm_weight);
    for (int r = threadIdx.x / 32; r < R; r += kStagedWarps) {
      float* row = sq + r * D;
      if (r >= nr) {
        for (int d = lane; d < D; d += 32) row[d] = 0.f;
        continue;
      }
      normalize_head_in_warp(q + r * a.q_stride[1], a.q_stride[2], weight, a.norm_eps, D, lane,
                             [&](int d, T y) { row[d] = to_acc(y); });
      __syncwarp();
      for (int i = lane; i < half; i += 32) {
        const int first = i * a.pair_step, second = first + a.partner;
        T y1, y2;
        rotate_pair(row[first], row[second], pos, freq.v[i], y1, y2);
        row[first] = to_acc(y1);
        row[second] = to_acc(y2);
      }
    }
    return;
  }
  for (int idx = threadIdx.x; idx < R * half; idx += kStagedThreads) {
    const int r = idx / half, i = idx % half, first = i * a.pair_step, second = first + a.partner;
    T y1 = from_acc<T>(0.f), y2 = from_acc<T>(0.f);
    if (r < nr) {
      const T* qr = q + r * a.q_stride[1];
      rotate_pair(to_acc(qr[first * a.q_stride[2]]), to_acc(qr[second * a.q_stride[2]]), pos, freq.v[i], y1, y2);
    }
    sq[r * D + first] = to_acc(y1);
    sq[r * D + second] = to_acc(y2);
  }
}

// The fused decode step's new key and value (token n, kv head hk) into staged row jj: the key turned by the rotary
// embedding at the token's position, both also written to the token's slot in the pools when `writes_pool` (once per
// token and kv head) and the slot is the block table's slot for that position; `report` reports one that is not.
template <typename T>
__device__ __forceinline__ void take_new_key_value(const PagedArgs& a, const RopeFreq& freq, int64_t n, int hk,
                                                   const Token& tok, int jj, bool writes_pool, bool report, int D,
                                                   int pitch, T* sk, T* sv, int* bad) {
  const int tid = threadIdx.x, half = D / 2;
  const float pos = static_cast<float>(tok.pos);
  const T* kn = static_cast<const T*>(a.k_new) + n * a.k_new_stride[0] + hk * a.k_new_stride[1];
  const T* vn = static_cast<const T*>(a.v_new) + n * a.v_new_stride[0] + hk * a.v_new_stride[1];
  int64_t kw = -1, vw = -1;
  if (writes_pool) {
    const int slot = a.slots[n * a.slot_stride];
    const int block = key_block(a, tok.seq, tok.pos, false);
    if (block >= 0 && slot == block * a.block_size + tok.pos % a.block_size) {
      const int64_t row = tok.pos % a.block_size;
      kw = block * a.k_stride[0] + row * a.k_stride[1] + hk * a.k_stride[2];
      vw = block * a.v_stride[0] + row * a.v_stride[1] + hk * a.v_stride[2];
    } else if (tid == 0 && report) {
      report_device_error(a.error_word, DeviceErrorCode::paged_slot, slot);
    }
  }
  T* kpw = const_cast<T*>(static_cast<const T*>(a.k_pool));
  T* vpw = const_cast<T*>(static_cast<const T*>(a.v_pool));
  T* key = sk + jj * pitch;
  auto turn = [&](int i, float x1, float x2) {  // pair i from x1, x2 into the staged row and the pool
    const int first = i * a.pair_step, second = first + a.partner;
    T y1, y2;
    rotate_pair(x1, x2, pos, freq.v[i], y1, y2);
    key[first] = y1;
    key[second] = y2;
    if (kw >= 0) {
      kpw[kw + first] = y1;
      kpw[kw + second] = y2;
    }
  };
  if (a.k_norm_weight != nullptr) {
    // QK-norm: the last warp normalizes the key into its staged row, then turns it, while the first warps normalize
    // the query rows (load_rotated_queries: a warp a row, and a decode CTA's rows are mostly fewer than its warps).
    if (tid / 32 == kStagedWarps - 1) {
      const int lane = tid % 32;
      normalize_head_in_warp(kn, a.k_new_stride[2], static_cast<const T*>(a.k_norm_weight), a.norm_eps, D, lane,
                             [&](int d, T y) { key[d] = y; });
      __syncwarp();
      for (int i = lane; i < half; i += 32)
        turn(i, to_acc(key[i * a.pair_step]), to_acc(key[i * a.pair_step + a.partner]));
    }
  } else {
    for (int i = tid; i < half; i += kStagedThreads) {
      turn(i, to_acc(kn[i * a.pair_step * a.k_new_stride[2]]),
           to_acc(kn[(i * a.pair_step + a.partner) * a.k_new_stride[2]]));
    }
  }
  for (int d = tid; d < D; d += kStagedThreads) {
    const T x = vn[d * a.v_new_stride[2]];
    sv[jj * pitch + d] = x;
    if (vw >= 0) vpw[vw + d] = x;
  }
  if (tid == 0) bad[jj] = 0;
}

// Phases 1-3 over nk staged keys (sk, sv [nk][pitch]) for the R query rows in sq (nr of them real), after the
// barrier that publishes the staged rows, on the CUDA cores: scores (a thread per key), each row's max m and sum l
// of exp(s - m) (sm, sl [R]; a warp per row), and o = sum p v (a thread per 8-dim slice and key slice, the warp's
// key slices summed with shuffles). Leaves o's per-warp sums in red [warps][R][D] (which aliases the staged rows:
// they are dead by then), so o_r[d] = sum over w of red[(w * R + r) * D + d], published by a final barrier.
template <typename T, int R>
__device__ __forceinline__ void attend_on_cuda_cores(const PagedArgs& a, int D, int chunk, int pitch, int nk, int nr,
                                                     const T* sk, const T* sv, const float* sq, float* sc, float* sm,
                                                     float* sl, const int* bad, float* red) {
  // (threadIdx.x unsigned: the lane and warp arithmetic below compiles to masks and shifts)
  // ---- phase 1: scores, one key per thread, all rows at once ----
  for (int jj = threadIdx.x; jj < nk; jj += kStagedThreads) {
    float acc[R];
    decode_phases::dot_rows<R>(sk + jj * pitch, sq, D, acc);
    const bool valid = !bad[jj];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r * chunk + jj] = valid && r < nr ? acc[r] * a.scale : -INFINITY;
  }
  __syncthreads();

  // ---- phase 2: chunk max and sum per row; scores become p = exp(s - m) (0 for bad keys) ----
  decode_phases::softmax_rows<R>(sc, chunk, nk, sm, sl, kStagedWarps);
  __syncthreads();

  // ---- phase 3: o = sum_j p_j v_j: lane = (key slice in the warp, 8-dim slice); slices summed by shuffles ----
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, dims8 = D / 8;
  const int per_warp = 32 / dims8, dc = lane % dims8, kq = lane / dims8;
  float acc[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.f;
  for (int jj = warp * per_warp + kq; jj < nk; jj += kStagedWarps * per_warp) {
    float vx[8];
    load8(sv + jj * pitch + dc * 8, vx);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float p = sc[r * chunk + jj];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][e] += p * vx[e];
    }
  }
  for (int offset = dims8; offset < 32; offset <<= 1) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][e] += MICROLLM_SHFL_XOR(acc[r][e], offset);
  }
  __syncthreads();  // the staged rows are dead: red overwrites them
  if (lane / dims8 == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(warp * R + r) * D + (lane % dims8) * 8 + e] = acc[r][e];
  }
  __syncthreads();
}

// The same phases and results (up to the order of the sums) where a CTA holds 8 rows in bf16 or f16 of a compiled
// head dim: phases 1 and 3 on the tensor cores (decode_mma.cuh), after zeroing V's rows from nk up to the next 16
// keys (which the MMAs read). The choice is the kernel's template arguments', never the data's.
template <typename T, int R, int kDim>
__device__ __forceinline__ void attend_staged_keys(const PagedArgs& a, int D, int chunk, int pitch, int nk, int nr,
                                                   const T* sk, T* sv, const float* sq, float* sc, float* sm, float* sl,
                                                   const int* bad, float* red) {
  if constexpr (decode_phases::kStagedOnTensorCores<T, R, kDim>) {
    const int padding = (nk + 15) / 16 * 16 - nk;  // within the chunk: a multiple of 32 keys
    for (int idx = threadIdx.x; idx < padding * kDim; idx += kStagedThreads) {
      sv[(nk + idx / kDim) * pitch + idx % kDim] = from_acc<T>(0.f);
    }
    decode_phases::scores_mma<T, kDim, kStagedWarps>(sk, pitch, sq, nk, chunk, nr, a.scale, bad, sc);
    __syncthreads();  // the scores and V's zeroed rows
    decode_phases::softmax_rows<R>(sc, chunk, nk, sm, sl, kStagedWarps);
    __syncthreads();
    decode_phases::accumulate_pv_mma<T, kDim, kStagedWarps>(sv, pitch, sc, chunk, nk, red);
  } else {
    attend_on_cuda_cores<T, R>(a, D, chunk, pitch, nk, nr, sk, sv, sq, sc, sm, sl, bad, red);
  }
}

// kProject, the o projection after phase 3 (R = 1, one split, kDirect, kFused; paged_projection.cuh): each
// cluster computes one token's attention, CTA rank h holding query head h, and a token has `replicas` such
// clusters (grid y). Before it waits (no kernel writes a weight) each CTA copies its o_cols rows of o_weight to
// shared memory (replicas > 1) or starts them for L2 (one cluster a token); it rounds its head's output to T as
// paged_decode_attention would write it, gathers the token's Hq * D outputs from the cluster's shared memory (one
// exchange of 2 bytes an element) and computes its columns, the addend added before the one rounding
// (linear_add's arithmetic).
// Why: at batch 1 the o GEMV on its own costs a decode step mostly a kernel boundary's latency rather than its
// weights' bytes (docs/perf/kernels.md#paged-attention). Replicated clusters repeat the attention (its K/V rows are
// L2 hits after the first) so that o_weight spreads over more SMs, in pieces small enough to sit in shared memory
// beside the qkv kernel's CTAs while that kernel still runs.

// Shared memory: the staged rows K, V [chunk][pitch] of T (stage_bytes, reused for the cross-warp sums
// [warps][R][D] f32 after phase 3), then f32: q [R][D], scores [R][chunk], row stats m, l [R]; then
// one flag per key (its block id is bad); with kProject, from proj_offset: the head's output [D], the token's
// outputs [o_in] and the CTA's rows of o_weight [o_cols][o_in], of T.
// kRowsStaged (kProject, replicas > 1): the o_weight rows in shared memory, [o_cols][o_in] after the outputs.
// kDim: the head dim when compiled for one (with_head_dim), else 0 and a.dim.
template <typename T, int R, int kDim, bool kDirect, bool kFused, bool kProject = false, bool kRowsStaged = false>
__global__ void __launch_bounds__(kStagedThreads) paged_staged_kernel(const PagedArgs a, const RopeFreq freq) {
  static_assert(!kProject || (R == 1 && kDirect && kFused), "the projection follows a one-split fused decode step");
  static_assert(kProject || !kRowsStaged, "only the projection stages weight rows");
  extern __shared__ __align__(16) unsigned char paged_smem[];
  const int D = kDim > 0 ? kDim : a.dim, chunk = a.chunk, pitch = a.pitch;
  T* sk = reinterpret_cast<T*>(paged_smem);
  T* sv = sk + chunk * pitch;
  float* red = reinterpret_cast<float*>(paged_smem);
  float* sq = reinterpret_cast<float*>(paged_smem + a.stage_bytes);
  float* sc = sq + R * D;
  float* sm = sc + R * chunk;
  float* sl = sm + R;
  int* bad = reinterpret_cast<int*>(sl + R);

  // Launched chained: q (and k, v) come from the kernel before, so they wait for it (wait_for_prior_grids).
  // The fused decode step stages its chunk's cached K/V rows first: in a decode step no kernel writes them (the
  // rows before the token's position were written by earlier steps; the step's positions, sequence ids and
  // block tables are uploaded before it starts), so that copy overlaps the kernel before. Every path waits
  // before it writes: out may be memory the kernel before still reads.
  auto wait_for_inputs = [] {
    wait_for_prior_grids();
    chain_next_grids();
  };
  if constexpr (!kFused) wait_for_inputs();
  const int rb = blockIdx.x % a.row_blocks;
  const int hk = (blockIdx.x / a.row_blocks) % a.kv_heads;
  const int64_t n = blockIdx.x / (a.row_blocks * a.kv_heads);
  // Grid y: the split, or with kProject the replica (one split); only the first replica writes the pools.
  const int split = kProject ? 0 : static_cast<int>(blockIdx.y);
  const bool first_replica = !kProject || blockIdx.y == 0;
  const int r0 = rb * R, nr = min(R, a.group - r0);
  const int tid = threadIdx.x;
  const bool reporter = split == 0 && rb == 0 && hk == 0 && tid == 0 && first_replica;
  // kProject: this CTA's output columns [col0(), col0() + cols()), recomputed where used (fewer live registers).
  auto col0 = [&] { return projected_col0(a.q_heads, a.o_cols); };
  auto cols = [&] { return projected_cols(a.q_heads, a.o_cols, a.hidden); };
  const Token tok = resolve(a, n, reporter);
  const int c0 = first_key(a, tok) + split * chunk;
  auto out_row = [&](int r) { return (n * a.q_heads + hk * a.group + r0 + r); };  // row of [N * Hq]
  if (c0 >= tok.len) {  // padding, or a split past the sequence's end: the combine does not read it
    if constexpr (kFused) wait_for_inputs();
    if constexpr (kProject) {  // the token's attention is 0: its columns are the addend (every CTA of the
                               // cluster is here, so none waits at a cluster barrier)
      T* o = static_cast<T*>(a.proj_out) + n * a.hidden;
      const T* add = static_cast<const T*>(a.addend);
      for (int c = col0() + tid; c < col0() + cols(); c += kStagedThreads) {
        o[c] = add ? add[n * a.hidden + c] : from_acc<T>(0.f);
      }
    } else if constexpr (kDirect) {  // one split: this CTA owns the output rows
      T* o = static_cast<T*>(a.out);
      for (int idx = tid; idx < nr * D; idx += kStagedThreads) o[out_row(idx / D) * D + idx % D] = from_acc<T>(0.f);
    }
    return;
  }
  const int nk = min(chunk, tok.len - c0);  // >= 1
  // Fused: the chunk that holds the token's own position takes its new key and value from k_new / v_new.
  const bool holds_new = kFused && tok.pos < c0 + nk;
  const int from_pool = holds_new ? nk - 1 : nk;

  // ---- phase 0: stage the chunk's K and V rows (every 16-byte copy in flight at once); the queries ----
  stage_key_rows(a, tok.seq, hk, c0, from_pool, D, pitch, sk, sv, bad, rb == 0 && hk == 0 && first_replica);
  T* head_out = reinterpret_cast<T*>(paged_smem + a.proj_offset);  // kProject's region
  T* x_full = head_out + D;
  T* w_rows = x_full + a.o_in;  // kRowsStaged
  auto o_rows = [&] { return static_cast<const T*>(a.o_weight) + static_cast<int64_t>(col0()) * a.o_weight_stride; };
  float first_addend = 0.f;
  if constexpr (kProject) {  // the CTA's rows of o_weight (no kernel writes a weight): to shared memory, or for L2
    const int packs = a.o_in / 8;
    if constexpr (kRowsStaged) {
      for (int p = tid; p < cols() * packs; p += kStagedThreads) {
        copy16_async(w_rows + p * 8, o_rows() + static_cast<int64_t>(p / packs) * a.o_weight_stride + p % packs * 8);
      }
    } else if (tid < cols()) {
      prefetch_l2(o_rows() + static_cast<int64_t>(tid) * a.o_weight_stride, static_cast<unsigned>(a.o_in * sizeof(T)));
    }
  }
  if constexpr (kFused) wait_for_inputs();
  if constexpr (kProject) {  // the addend is an earlier kernel's output: read after the wait, used at the end
    const int lane = tid % 32, j = tid / 32 + lane * kStagedWarps;  // project_rows: this warp's lane-th row
    if (a.addend && j < cols()) first_addend = to_acc(static_cast<const T*>(a.addend)[n * a.hidden + col0() + j]);
  }
  const T* q = static_cast<const T*>(a.q) + n * a.q_stride[0] + (hk * a.group + r0) * a.q_stride[1];
  if constexpr (kFused) {
    load_rotated_queries<T, R>(a, freq, q, nr, static_cast<float>(tok.pos), D, sq);
    // The first row block (of the first replica) writes the pools, once.
    if (holds_new)
      take_new_key_value(a, freq, n, hk, tok, nk - 1, rb == 0 && first_replica, hk == 0, D, pitch, sk, sv, bad);
  } else {
    for (int idx = tid; idx < R * D; idx += kStagedThreads) {
      const int r = idx / D, d = idx % D;
      sq[idx] = r < nr ? to_acc(q[r * a.q_stride[1] + d * a.q_stride[2]]) : 0.f;
    }
  }
  copy_async_wait_all();
  __syncthreads();

  attend_staged_keys<T, R, kDim>(a, D, chunk, pitch, nk, nr, sk, sv, sq, sc, sm, sl, bad, red);
  for (int idx = tid; idx < nr * D; idx += kStagedThreads) {
    const int r = idx / D, d = idx % D;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kStagedWarps; ++w) o += red[(w * R + r) * D + d];
    const int64_t row = out_row(r);
    if constexpr (kProject) {
      head_out[d] = from_acc<T>(sl[r] > 0.f ? o / sl[r] : 0.f);
    } else if constexpr (kDirect) {
      static_cast<T*>(a.out)[row * D + d] = from_acc<T>(sl[r] > 0.f ? o / sl[r] : 0.f);
    } else {
      a.part_o[(row * a.n_split + split) * D + d] = o;
    }
  }
  if constexpr (!kDirect) {
    for (int r = tid; r < nr; r += kStagedThreads) {
      const int64_t row = out_row(r);
      a.part_m[row * a.n_split + split] = sm[r];
      a.part_l[row * a.n_split + split] = sl[r];
    }
  }
  if constexpr (kProject) {
    cluster_arrive();
    cluster_wait();  // every CTA of the token has written its head_out
    gather_heads<kStagedThreads>(head_out, x_full, a.o_in, D);
    cluster_arrive();  // done reading the others' head_out; they may exit once all have arrived
    __syncthreads();
    T* out = static_cast<T*>(a.proj_out) + n * a.hidden + col0();
    if constexpr (kRowsStaged)
      project_rows<true, kStagedWarps>(x_full, w_rows, a.o_in, cols(), a.o_in, rounded_store(out, first_addend));
    else
      project_rows<false, kStagedWarps>(x_full, o_rows(), a.o_weight_stride, cols(), a.o_in,
                                        rounded_store(out, first_addend));
    cluster_wait();  // no CTA leaves while another may still read its shared memory
  }
}

// One block per query row (n, h) of [N * Hq]; shared memory: the splits' weights [n_split] and 32 floats
// of reduction scratch. Only the splits that ran (those that start before the token's length) are read.
template <typename T>
__global__ void __launch_bounds__(kSmallThreads) paged_combine_kernel(const PagedArgs a, int64_t rows) {
  extern __shared__ __align__(16) float combine_smem[];
  float* w = combine_smem;
  float* scratch = w + a.n_split;
  wait_for_prior_grids();  // launched chained after the staged kernel
  chain_next_grids();
  const int D = a.dim;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const Token tok = resolve(a, row / a.q_heads, false);                    // the partial kernel reported bad values
    const int used = (tok.len - first_key(a, tok) + a.chunk - 1) / a.chunk;  // 0 for padding
    decode_phases::combine_row(a.part_m + row * a.n_split, a.part_l + row * a.n_split, a.part_o + row * a.n_split * D,
                               used, D, w, scratch, static_cast<T*>(a.out) + row * D);
  }
}

// paged_decode_attention_projected past one split: the combine kernel and the o projection in one launch
// (combine_and_project), grid (tokens x q_heads, replicas) in clusters of q_heads, CTA (h, r) merging query head h
// and computing replica r's share of the columns. Shared memory: the merge's [n_split + 32] floats, then from
// proj_offset head [D], the token's heads [o_in] and, with kRowsStaged, the CTA's o_weight rows [o_cols][o_in].
template <typename T, bool kRowsStaged>
__global__ void __launch_bounds__(kSmallThreads) paged_combine_projected_kernel(const PagedArgs a) {
  constexpr int kWarps = kSmallThreads / 32;
  extern __shared__ __align__(16) unsigned char combine_projected_smem[];
  const int64_t n = blockIdx.x / a.q_heads, row = blockIdx.x;  // row (n, h) of [N * Hq]
  const int col0 = projected_col0(a.q_heads, a.o_cols), cols = projected_cols(a.q_heads, a.o_cols, a.hidden);
  const T* w = static_cast<const T*>(a.o_weight) + static_cast<int64_t>(col0) * a.o_weight_stride;
  T* head = reinterpret_cast<T*>(combine_projected_smem + a.proj_offset);
  T* w_rows = head + a.dim + a.o_in;  // kRowsStaged
  // No kernel writes a weight: the rows start on their way before the wait.
  if constexpr (kRowsStaged) {
    const int packs = a.o_in / 8;
    for (int p = static_cast<int>(threadIdx.x); p < cols * packs; p += kSmallThreads) {
      copy16_async(w_rows + p * 8, w + static_cast<int64_t>(p / packs) * a.o_weight_stride + p % packs * 8);
    }
    copy_async_commit();
  } else if (static_cast<int>(threadIdx.x) < cols) {
    prefetch_l2(w + threadIdx.x * a.o_weight_stride, static_cast<unsigned>(a.o_in * sizeof(T)));
  }
  wait_for_prior_grids();  // the splits' partials, the addend
  chain_next_grids();
  const int lane = threadIdx.x % 32, j = threadIdx.x / 32 + lane * kWarps;  // project_rows: this lane's row
  const float first_addend =
      a.addend && j < cols ? to_acc(static_cast<const T*>(a.addend)[n * a.hidden + col0 + j]) : 0.f;
  // The staged kernel reported bad values; a padding row merges no split: a head of zeros.
  const Token tok = resolve(a, n, false);
  const int used = (tok.len - first_key(a, tok) + a.chunk - 1) / a.chunk;
  combine_and_project<kSmallThreads, kRowsStaged>(
      a.part_m + row * a.n_split, a.part_l + row * a.n_split, a.part_o + row * a.n_split * a.dim, used, a.dim,
      reinterpret_cast<float*>(combine_projected_smem), a.n_split, head, head + a.dim, a.o_in, kRowsStaged ? w_rows : w,
      kRowsStaged ? a.o_in : a.o_weight_stride, cols, first_addend, static_cast<T*>(a.proj_out) + n * a.hidden + col0);
}

// paged_decode_attention_projected past one split, in one kernel where a token's attention fits one cluster
// (paged_decode_plan.h: token_cluster). A token has clusters of kv_heads x slices CTAs (grid y: replicas, as
// kProject's); CTA rank c takes kv head c / slices and slice c % slices of the token's keys (an even share of its
// length, at most a.chunk) for all R of that kv head's query heads, as a split of the staged kernel does, but keeps
// its (m, l, o) in shared memory. After a cluster barrier CTA c < q_heads merges query head c from the slices of
// its kv head (the combine's formula, read over distributed shared memory) and exchange_and_project does the rest.
// A CTA whose slice holds no key (a short sequence, padding) takes part with m = -inf, l = 0: every CTA reaches
// every cluster barrier.
// Why: past one split the attention was two kernels (the splits, then their merge and the projection), and the
// second waited for the whole grid of the first.
// kHeadClusters (paged_decode_plan.h: head_clusters): a cluster holds ONE kv head's slices (twice the slices of a
// token's cluster with 2 kv heads, so a 4,096-key graph's slices still fit one chunk), and a token has kv_heads
// clusters (grid x: token, kv head, rank). CTA c < group merges query head c of its kv head; the cluster projects its
// heads' part of the input, x [group * D], onto the CTA's columns (partial sums, f32, to a.proj_partial), and the last
// of the token's kv_heads clusters to arrive at a column block's counter adds the parts in kv-head order and the addend
// (merge_partial_columns): deterministic whichever arrives last.
// Shared memory: paged_staged_kernel's (sk, sv, red; sq [R][D], sc [R][chunk], sm, sl [R]), then o's sums
// po [R][D] f32, then bad [chunk]; from proj_offset the head [D], the cluster's heads [x_len] and (kRowsStaged) the
// CTA's o_weight rows [o_cols][x_len].
template <typename T, int R, int kDim, bool kRowsStaged, bool kHeadClusters = false>
__global__ void __launch_bounds__(kStagedThreads) paged_token_cluster_kernel(const PagedArgs a, const RopeFreq freq) {
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char cluster_smem[];
  const int D = kDim > 0 ? kDim : a.dim, chunk = a.chunk, pitch = a.pitch;
  T* sk = reinterpret_cast<T*>(cluster_smem);
  T* sv = sk + chunk * pitch;
  float* red = reinterpret_cast<float*>(cluster_smem);
  float* sq = reinterpret_cast<float*>(cluster_smem + a.stage_bytes);
  float* sc = sq + R * D;
  float* sm = sc + R * chunk;
  float* sl = sm + R;
  float* po = sl + R;
  int* bad = reinterpret_cast<int*>(po + R * D);
  T* head = reinterpret_cast<T*>(cluster_smem + a.proj_offset);
  T* x_full = head + D;
  // The projection's input: every query head of the token, or (kHeadClusters) those of the cluster's kv head.
  const int x_len = kHeadClusters ? a.group * D : a.o_in;
  T* w_rows = x_full + x_len;

  const int ctas = kHeadClusters ? a.slices : a.kv_heads * a.slices, rank = static_cast<int>(blockIdx.x) % ctas;
  const int64_t cluster_id = blockIdx.x / ctas;
  const int64_t n = kHeadClusters ? cluster_id / a.kv_heads : cluster_id;
  const int hk = kHeadClusters ? static_cast<int>(cluster_id % a.kv_heads) : rank / a.slices;
  const int slice = rank % a.slices, nr = a.group;
  const bool first_replica = blockIdx.y == 0;  // writes the pools
  const int tid = threadIdx.x;
  const Token tok = resolve(a, n, rank == 0 && (!kHeadClusters || hk == 0) && tid == 0 && first_replica);
  const int key0 = first_key(a, tok);
  const int span = (tok.len - key0 + a.slices - 1) / a.slices;  // <= chunk, as the plan's keys() bound len - key0
  const int c0 = key0 + slice * span, nk = max(0, min(span, tok.len - c0));
  const bool holds_new = nk > 0 && tok.pos < c0 + nk;  // the token's own key and value: the slice's last
  const int from_pool = holds_new ? nk - 1 : nk;

  // Before the wait (no kernel of the step writes them; paged_staged_kernel's comment): the slice's cached rows, and
  // the CTA's rows of o_weight (their part for this kv head's inputs) to shared memory or for L2.
  stage_key_rows(a, tok.seq, hk, c0, from_pool, D, pitch, sk, sv, bad, hk == 0 && first_replica);
  const int col0 = projected_col0(ctas, a.o_cols), cols = projected_cols(ctas, a.o_cols, a.hidden);
  const T* o_rows = static_cast<const T*>(a.o_weight) + static_cast<int64_t>(col0) * a.o_weight_stride +
                    (kHeadClusters ? hk * x_len : 0);
  if constexpr (kRowsStaged) {
    const int packs = x_len / 8;
    for (int p = tid; p < cols * packs; p += kStagedThreads) {
      copy16_async(w_rows + p * 8, o_rows + static_cast<int64_t>(p / packs) * a.o_weight_stride + p % packs * 8);
    }
  } else if (tid < cols) {
    prefetch_l2(o_rows + static_cast<int64_t>(tid) * a.o_weight_stride, static_cast<unsigned>(x_len * sizeof(T)));
  }
  wait_for_prior_grids();  // q, k, v and the addend come from the kernels before
  chain_next_grids();
  const int j = stored_row<kStagedWarps>();  // project_rows: this thread's row
  const float first_addend =
      a.addend && j < cols ? to_acc(static_cast<const T*>(a.addend)[n * a.hidden + col0 + j]) : 0.f;
  const T* q = static_cast<const T*>(a.q) + n * a.q_stride[0] + hk * a.group * a.q_stride[1];
  load_rotated_queries<T, R>(a, freq, q, nr, static_cast<float>(tok.pos), D, sq);
  if (holds_new) take_new_key_value(a, freq, n, hk, tok, nk - 1, first_replica, hk == 0, D, pitch, sk, sv, bad);
  copy_async_wait_all();
  __syncthreads();
  attend_staged_keys<T, R, kDim>(a, D, chunk, pitch, nk, nr, sk, sv, sq, sc, sm, sl, bad, red);
  for (int idx = tid; idx < nr * D; idx += kStagedThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kStagedWarps; ++w) o += red[(w * R + idx / D) * D + idx % D];
    po[idx] = o;
  }
  cluster_arrive();
  cluster_wait();  // every slice's (m, l, o) is in place
  // Query head `rank` of the token (row rank % group of kv head rank / group), or of the cluster's kv head.
  if (rank < (kHeadClusters ? a.group : a.q_heads) && tid < D) {
    const cg::cluster_group cluster = cg::this_cluster();
    const int first = kHeadClusters ? 0 : rank / a.group * a.slices, r = rank % a.group;
    float mx = -INFINITY;
    for (int s = 0; s < a.slices; ++s) mx = fmaxf(mx, cluster.map_shared_rank(sm, first + s)[r]);
    float sum = 0.f, o = 0.f;
    for (int s = 0; s < a.slices; ++s) {
      const float m = cluster.map_shared_rank(sm, first + s)[r];
      const float w = mx == -INFINITY || m == -INFINITY ? 0.f : expf(m - mx);
      sum += w * cluster.map_shared_rank(sl, first + s)[r];
      o += w * cluster.map_shared_rank(po, first + s)[r * D + tid];
    }
    head[tid] = from_acc<T>(sum > 0.f ? o / sum : 0.f);
  }
  const T* w = kRowsStaged ? w_rows : o_rows;
  const int64_t w_stride = kRowsStaged ? x_len : a.o_weight_stride;
  T* out = static_cast<T*>(a.proj_out) + n * a.hidden + col0;
  if constexpr (kHeadClusters) {
    float* partial = a.proj_partial + n * a.kv_heads * a.hidden + col0;  // [kv_heads][hidden] of token n
    exchange_and_project<kStagedThreads, kRowsStaged>(head, x_full, x_len, D, w, w_stride, cols,
                                                      [&](int jj, float sum) { partial[hk * a.hidden + jj] = sum; });
    const int block = static_cast<int>((n * gridDim.y + blockIdx.y) * ctas + rank);  // the column block's counter
    merge_partial_columns<kStagedWarps>(partial, a.hidden, a.kv_heads, cols, a.proj_counters + block, first_addend,
                                        out);
  } else {
    exchange_and_project<kStagedThreads, kRowsStaged>(head, x_full, x_len, D, w, w_stride, cols,
                                                      rounded_store(out, first_addend));
  }
}

// Any head dim, layout and sliding window: a block per query row (n, h); keys in steps of 128 (one per thread) with
// an online softmax; acc [D] in shared memory. Shared memory: q [D], acc [D], p [128], voff [128], scratch [32].
template <typename T>
__global__ void __launch_bounds__(kSmallThreads) paged_simple_kernel(const PagedArgs a) {
  extern __shared__ __align__(16) unsigned char simple_smem[];
  const int D = a.dim, tid = threadIdx.x;
  int64_t* voff = reinterpret_cast<int64_t*>(simple_smem);   // [128]
  float* sq = reinterpret_cast<float*>(voff + kSimpleKeys);  // [D]
  float* acc = sq + D;                                       // [D]
  float* sp = acc + D;                                       // [128]
  float* scratch = sp + kSimpleKeys;                         // [32]
  const int64_t row = blockIdx.x, n = row / a.q_heads;
  const int h = static_cast<int>(row % a.q_heads), hk = h / a.group;
  const Token tok = resolve(a, n, h == 0 && tid == 0);
  const T* q = static_cast<const T*>(a.q) + n * a.q_stride[0] + h * a.q_stride[1];
  for (int d = tid; d < D; d += kSmallThreads) {
    sq[d] = to_acc(q[d * a.q_stride[2]]);
    acc[d] = 0.f;
  }
  __syncthreads();
  const T* kp = static_cast<const T*>(a.k_pool);
  const T* vp = static_cast<const T*>(a.v_pool);
  float m = -INFINITY, l = 0.f;  // every thread holds the same running max and sum
  const int first = a.window > 0 ? max(0, tok.len - a.window) : 0;  // the sliding window's first key
  for (int c0 = first; c0 < tok.len; c0 += kSimpleKeys) {
    const int j = c0 + tid;
    float s = -INFINITY;
    int64_t vo = -1;
    if (j < tok.len) {
      const int64_t ko = key_offset(a, a.k_stride, tok.seq, j, hk, h == 0);
      if (ko >= 0) {
        vo = key_offset(a, a.v_stride, tok.seq, j, hk, false);
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += sq[d] * to_acc(kp[ko + d * a.k_stride[3]]);
        s = dot * a.scale;
      }
    }
    const float m_new = fmaxf(m, block_max(s, scratch));
    const float alpha = m == -INFINITY ? 0.f : expf(m - m_new);
    const float p = s == -INFINITY ? 0.f : expf(s - m_new);
    sp[tid] = p;
    voff[tid] = vo;
    l = l * alpha + block_sum(p, scratch);  // its barriers also publish sp and voff
    const int keys = min(kSimpleKeys, tok.len - c0);
    for (int d = tid; d < D; d += kSmallThreads) {
      float x = acc[d] * alpha;
      for (int t = 0; t < keys; ++t) {
        if (voff[t] >= 0) x += sp[t] * to_acc(vp[voff[t] + d * a.v_stride[3]]);
      }
      acc[d] = x;
    }
    m = m_new;
    __syncthreads();  // sp and voff are rewritten by the next step
  }
  T* o = static_cast<T*>(a.out) + row * D;
  for (int d = tid; d < D; d += kSmallThreads) o[d] = from_acc<T>(l > 0.f ? acc[d] / l : 0.f);
}

}  // namespace
}  // namespace microllm::cuda_kernels::paged
