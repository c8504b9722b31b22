// CUDA kernels of the paged KV cache (include/microllm/ops/paged_attention.h).
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
//     key slice, summed over the warp's key slices with shuffles, then over warps in shared memory). With one
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
// heads fit one thread-block cluster (one query head per CTA, one split, at most 2 tokens, 32 KB of o_weight rows
// a CTA in shared memory or 128 KB through L2: Qwen2.5-0.5B's batch-1/2 steps up to 256 keys): the heads' outputs
// meet through the cluster's shared memory and each CTA computes its share of the columns (kProject below; at
// batch 1 four clusters a token each compute the attention and a quarter of the columns). Past one split (a
// longer context) the combine kernel does the projection instead, a cluster a token (paged_combine_projected_kernel,
// within the same limits, rows through L2); elsewhere the o GEMV runs after the attention.
// Other head dims or layouts take the simple kernel: a block per query row, online softmax over chunks
// of 128 keys, strided scalar loads (paged_decode_attention: the composition of the separate ops).
// paged_kv_write and paged_gather, plain copies, are in paged_cache_copy.cu.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "../../core/cuda/device_errors.h"
#include "../environment.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "decode_phases.cuh"
#include "op_scope.h"
#include "paged_attention.h"
#include "paged_projection.cuh"
#include "rope.cuh"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels::paged {
namespace {

using detail::DeviceErrorCode;
using detail::report_device_error;

constexpr int kStagedThreads = 256;  // the staged kernel
constexpr int kStagedWarps = kStagedThreads / 32;
constexpr int kSmallThreads = 128;  // the combine and simple kernels
constexpr int kRowsPerCta = 8;      // query heads per CTA (of one kv head); 1 when the grid would be small
constexpr int kMaxChunk = 256;
constexpr int kMinSplitChunk = 64;
// Past one chunk the splits aim at this many CTAs per SM (the header comment). Measured in the model
// (Qwen2.5-0.5B, prompt 2048 / batch 2 / 64 new, 2026-11-30, one call): 1 gives 1,756 tok/s where 2 gave
// 1,690 and half an SM 1,626-1,632: a split of 128 keys stages its rows in one round trip as a split of 64
// does, and the combine merges half as many.
constexpr int kSplitCtasPerSm = 1;
constexpr int64_t kStageBudget = 96 * 1024;  // bytes of staged K and V rows per CTA (2 CTAs fit an SM)
constexpr int64_t kStageBudgetAlone = 144 * 1024;  // one query head per CTA (a small grid): one CTA per SM is
                                                   // fine, and 256 keys of D 128 fit one split (no combine)
constexpr int kMaxStagedSmem = 160 * 1024;  // the staged kernel's shared memory at most: the budget + its f32 rows
constexpr int kMaxFastDim = 256;
constexpr int kMaxSplits = 8192;  // the combine kernel keeps one weight per split in shared memory
constexpr int kSimpleKeys = 128;  // keys per step of the simple kernel: one per thread
// paged_decode_attention_projected's one kernel (kProject) takes at most this many tokens, and a CTA at most this
// many bytes of o_weight: staged in shared memory (replicated clusters) or streamed through L2 (one cluster a
// token). Measured in the model (docs/perf/inference.md): Qwen2.5-0.5B batch 8 fused 8,256 tok/s against
// 8,795-8,811 with the o GEMV on its own (8 clusters each read all of o_weight through 14 SMs); R1-Distill-1.5B
// batch 1 (384 KB a CTA) 580 against 666; replicas past half the SMs or 32 KB a CTA lost (projection_replicas).
constexpr int64_t kMaxProjectedTokens = 2;
constexpr int64_t kMaxStagedProjection = 32 << 10;
constexpr int64_t kMaxStreamedProjection = 128 << 10;
constexpr int kMaxReplicas = 8;

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
  float scale;
  int row_blocks;  // ceil(group / R), R the rows per CTA the staged launch chose
  int chunk, n_split;
  int pitch;          // elements per staged K/V row: D plus 16 bytes, so a warp's rows spread over the banks
  int stage_bytes;    // the staged rows' region (the cross-warp sums reuse it)
  float* part_o;  // [N * Hq][n_split][D]
  float* part_m;  // [N * Hq][n_split]
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
  // paged_decode_attention_projected (kProject): out [N, hidden] = addend + attention @ o_weight^T; `replicas`
  // clusters of q_heads CTAs per token (grid y: the replica), each cluster computing the token's attention and
  // CTA h of replica r columns [(r * q_heads + h) * o_cols, +o_cols) from its rows of o_weight [hidden, o_in].
  const void* o_weight;
  int64_t o_weight_stride;
  const void* addend;  // [N, hidden] contiguous, may be null
  void* proj_out;      // [N, hidden] contiguous
  int hidden, o_in, o_cols, replicas;
  int proj_offset;  // bytes of shared memory before the projection's region (16-byte aligned)
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

// kProject, the o projection after phase 3 (R = 1, one split, kDirect, kFused; paged_projection.cuh): each
// cluster computes one token's attention, CTA rank h holding query head h, and a token has `replicas` such
// clusters (grid y). Before it waits (no kernel writes a weight) each CTA copies its o_cols rows of o_weight to
// shared memory (replicas > 1) or starts them for L2 (one cluster a token); it rounds its head's output to T as
// paged_decode_attention would write it, gathers the token's Hq * D outputs from the cluster's shared memory (one
// exchange of 2 bytes an element) and computes its columns, the addend added before the one rounding
// (linear_add's arithmetic).
// Why (docs/perf/inference.md): at batch 1 the o GEMV on its own costs Qwen2.5-0.5B's decode step 4.2 us a
// layer, mostly a kernel boundary's latency rather than its 1.6 MB of weights. One cluster a token (14 SMs
// reading 115 KB each from L2 after the attention) gave back part of that; replicated clusters repeat the
// attention (its K/V rows are L2 hits after the first) so that o_weight spreads over 4x more SMs, in pieces small
// enough to sit in shared memory beside the qkv kernel's CTAs while that kernel still runs.

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
  const int D = kDim > 0 ? kDim : a.dim, chunk = a.chunk, pitch = a.pitch, dims8 = D / 8;
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
  const int split = kProject ? 0 : static_cast<int>(blockIdx.y), c0 = split * chunk;
  const bool first_replica = !kProject || blockIdx.y == 0;
  const int r0 = rb * R, nr = min(R, a.group - r0);
  const int tid = threadIdx.x;
  const bool reporter = split == 0 && rb == 0 && hk == 0 && tid == 0 && first_replica;
  // kProject: this CTA's output columns [col0(), col0() + cols()), recomputed where used (fewer live registers).
  auto col0 = [&] { return projected_col0(a.q_heads, a.o_cols); };
  auto cols = [&] { return projected_cols(a.q_heads, a.o_cols, a.hidden); };
  const Token tok = resolve(a, n, reporter);
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
  const T* kp = static_cast<const T*>(a.k_pool);
  const T* vp = static_cast<const T*>(a.v_pool);

  // ---- phase 0: stage the chunk's K and V rows (every 16-byte copy in flight at once); the queries ----
  constexpr int kPiece = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  const int pieces = D / kPiece;
  for (int p = tid; p < from_pool * pieces; p += kStagedThreads) {
    const int jj = p / pieces, part = (p % pieces) * kPiece;
    T* kd = sk + jj * pitch + part;
    T* vd = sv + jj * pitch + part;
    const int block = key_block(a, tok.seq, c0 + jj, part == 0 && rb == 0 && hk == 0 && first_replica);
    if (part == 0) bad[jj] = block < 0;
    if (block < 0) {  // zeros, so the skipped key's p = 0 never meets a NaN
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const int64_t row = static_cast<int64_t>((c0 + jj) % a.block_size);
    copy16_async(kd, kp + block * a.k_stride[0] + row * a.k_stride[1] + hk * a.k_stride[2] + part);
    copy16_async(vd, vp + block * a.v_stride[0] + row * a.v_stride[1] + hk * a.v_stride[2] + part);
  }
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
    const int half = D / 2;
    const float pos = static_cast<float>(tok.pos);
    for (int idx = tid; idx < R * half; idx += kStagedThreads) {
      const int r = idx / half, i = idx % half, first = i * a.pair_step, second = first + a.partner;
      T y1 = from_acc<T>(0.f), y2 = from_acc<T>(0.f);
      if (r < nr) {
        const T* qr = q + r * a.q_stride[1];
        rotate_pair(to_acc(qr[first * a.q_stride[2]]), to_acc(qr[second * a.q_stride[2]]), pos, freq.v[i], y1, y2);
      }
      sq[r * D + first] = to_acc(y1);
      sq[r * D + second] = to_acc(y2);
    }
    if (holds_new) {
      const int jj = nk - 1;
      const T* kn = static_cast<const T*>(a.k_new) + n * a.k_new_stride[0] + hk * a.k_new_stride[1];
      const T* vn = static_cast<const T*>(a.v_new) + n * a.v_new_stride[0] + hk * a.v_new_stride[1];
      // The first row block (of the first replica) writes the pools, once: the slot must be the table's slot for
      // this position.
      int64_t kw = -1, vw = -1;
      if (rb == 0 && first_replica) {
        const int slot = a.slots[n * a.slot_stride];
        const int block = key_block(a, tok.seq, tok.pos, false);
        if (block >= 0 && slot == block * a.block_size + tok.pos % a.block_size) {
          const int64_t row = tok.pos % a.block_size;
          kw = block * a.k_stride[0] + row * a.k_stride[1] + hk * a.k_stride[2];
          vw = block * a.v_stride[0] + row * a.v_stride[1] + hk * a.v_stride[2];
        } else if (tid == 0 && hk == 0) {
          report_device_error(a.error_word, DeviceErrorCode::paged_slot, slot);
        }
      }
      T* kpw = const_cast<T*>(kp);
      T* vpw = const_cast<T*>(vp);
      for (int i = tid; i < half; i += kStagedThreads) {
        const int first = i * a.pair_step, second = first + a.partner;
        T y1, y2;
        rotate_pair(to_acc(kn[first * a.k_new_stride[2]]), to_acc(kn[second * a.k_new_stride[2]]), pos, freq.v[i],
                    y1, y2);
        sk[jj * pitch + first] = y1;
        sk[jj * pitch + second] = y2;
        if (kw >= 0) {
          kpw[kw + first] = y1;
          kpw[kw + second] = y2;
        }
      }
      for (int d = tid; d < D; d += kStagedThreads) {
        const T x = vn[d * a.v_new_stride[2]];
        sv[jj * pitch + d] = x;
        if (vw >= 0) vpw[vw + d] = x;
      }
      if (tid == 0) bad[jj] = 0;
    }
  } else {
    for (int idx = tid; idx < R * D; idx += kStagedThreads) {
      const int r = idx / D, d = idx % D;
      sq[idx] = r < nr ? to_acc(q[r * a.q_stride[1] + d * a.q_stride[2]]) : 0.f;
    }
  }
  copy_async_wait_all();
  __syncthreads();

  // ---- phase 1: scores, one key per thread, all rows at once ----
  for (int jj = tid; jj < nk; jj += kStagedThreads) {
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
  const int lane = tid % 32, warp = tid / 32;
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
  if (kq == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(warp * R + r) * D + dc * 8 + e] = acc[r][e];
  }
  __syncthreads();
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
    // From shared memory a row at a time; from L2 eight rows' loads in flight.
    if constexpr (kRowsStaged)
      project_rows<1, kStagedWarps>(x_full, w_rows, a.o_in, cols(), a.o_in, first_addend, out);
    else
      project_rows<8, kStagedWarps>(x_full, o_rows(), a.o_weight_stride, cols(), a.o_in, first_addend, out);
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
    const Token tok = resolve(a, row / a.q_heads, false);  // the partial kernel reported bad values
    const int used = (tok.len + a.chunk - 1) / a.chunk;    // 0 for padding
    decode_phases::combine_row(a.part_m + row * a.n_split, a.part_l + row * a.n_split,
                               a.part_o + row * a.n_split * D, used, D, w, scratch, static_cast<T*>(a.out) + row * D);
  }
}

// paged_decode_attention_projected past one split: the combine kernel and the o projection in one launch
// (combine_and_project), grid (tokens x q_heads) in clusters of q_heads, CTA rank h merging query head h.
// Shared memory: the merge's [n_split + 32] floats, then from proj_offset head [D] and the token's heads [o_in].
template <typename T>
__global__ void __launch_bounds__(kSmallThreads) paged_combine_projected_kernel(const PagedArgs a) {
  constexpr int kWarps = kSmallThreads / 32;
  extern __shared__ __align__(16) unsigned char combine_projected_smem[];
  const int64_t n = blockIdx.x / a.q_heads, row = blockIdx.x;  // row (n, h) of [N * Hq]
  const int col0 = projected_col0(a.q_heads, a.o_cols), cols = projected_cols(a.q_heads, a.o_cols, a.hidden);
  const T* w = static_cast<const T*>(a.o_weight) + static_cast<int64_t>(col0) * a.o_weight_stride;
  if (static_cast<int>(threadIdx.x) < cols) {  // no kernel writes a weight: start the rows before the wait
    prefetch_l2(w + threadIdx.x * a.o_weight_stride, static_cast<unsigned>(a.o_in * sizeof(T)));
  }
  wait_for_prior_grids();  // the splits' partials, the addend
  chain_next_grids();
  const int lane = threadIdx.x % 32, j = threadIdx.x / 32 + lane * kWarps;  // project_rows: this lane's row
  const float first_addend =
      a.addend && j < cols ? to_acc(static_cast<const T*>(a.addend)[n * a.hidden + col0 + j]) : 0.f;
  // The staged kernel reported bad values; a padding row merges no split: a head of zeros.
  const Token tok = resolve(a, n, false);
  const int used = (tok.len + a.chunk - 1) / a.chunk;
  T* head = reinterpret_cast<T*>(combine_projected_smem + a.proj_offset);
  combine_and_project<kSmallThreads>(
      a.part_m + row * a.n_split, a.part_l + row * a.n_split, a.part_o + row * a.n_split * a.dim, used, a.dim,
      reinterpret_cast<float*>(combine_projected_smem), a.n_split, head, head + a.dim, a.o_in, w, a.o_weight_stride,
      cols, first_addend, static_cast<T*>(a.proj_out) + n * a.hidden + col0);
}

// Any head dim and layout: a block per query row (n, h); keys in steps of 128 (one per thread) with an
// online softmax; acc [D] in shared memory. Shared memory: q [D], acc [D], p [128], voff [128], scratch [32].
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
  for (int c0 = 0; c0 < tok.len; c0 += kSimpleKeys) {
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

// The staged kernel's 16-byte copies need unit stride along D and every row 16-byte aligned; its key-slice
// shuffles need D / 8 to divide a warp (D = 8, 16, ..., 256).
bool fast_layout(const Tensor& pool) {
  const int64_t dim = pool.size(3);
  return dim % 8 == 0 && dim <= kMaxFastDim && 32 % (dim / 8) == 0 && rows::rows_aligned16(pool);
}

// Whether the staged kernel takes these shapes: both pools' layouts, the grid's x extent (tokens x kv heads x
// row blocks) and the combine kernel's split limit; otherwise the simple kernel (or, fused, the separate ops).
bool staged_fits(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, int64_t max_context) {
  // The largest grid x: one query head per CTA (tokens x q heads).
  return fast_layout(k_pool) && fast_layout(v_pool) && q.size(0) * q.size(1) < (int64_t{1} << 31) &&
         (max_context + 31) / 32 <= kMaxSplits;
}

// The staged kernel's plan for R rows per CTA, from what the host knows only (tokens, heads, max_context): the
// same grid on every replay. Sets a's row_blocks, pitch, chunk, n_split and stage_bytes; returns the shared
// memory the kernel needs (without kProject's region).
template <typename T, int R>
size_t plan_staged(PagedArgs& a, int64_t tokens, int64_t max_context, int sms) {
  a.row_blocks = (a.group + R - 1) / R;
  a.pitch = a.dim + static_cast<int>(16 / sizeof(T));
  const int64_t row_bytes = 2 * int64_t{a.pitch} * static_cast<int64_t>(sizeof(T));
  const int64_t budget = R == 1 ? kStageBudgetAlone : kStageBudget;
  const int64_t cap = std::max<int64_t>(32, std::min<int64_t>(kMaxChunk, budget / row_bytes) / 32 * 32);
  const int64_t base_ctas = tokens * a.kv_heads * a.row_blocks;
  int64_t chunk = cap;
  if (max_context <= cap) {
    chunk = (max_context + 31) / 32 * 32;  // one split: no combine kernel
  } else {
    const int64_t want_splits = std::max<int64_t>(1, (kSplitCtasPerSm * sms + base_ctas - 1) / base_ctas);
    chunk = (max_context + want_splits - 1) / want_splits;
    chunk = std::clamp<int64_t>((chunk + 31) / 32 * 32, std::min<int64_t>(kMinSplitChunk, cap), cap);
  }
  const int64_t n_split = (max_context + chunk - 1) / chunk;
  a.chunk = static_cast<int>(chunk);
  a.n_split = static_cast<int>(n_split);
  a.stage_bytes = static_cast<int>(
      std::max<int64_t>(chunk * row_bytes, int64_t{kStagedWarps} * R * a.dim * 4) + 15) / 16 * 16;
  return static_cast<size_t>(a.stage_bytes) + (R * (a.dim + chunk) + 2 * R + chunk) * sizeof(float);
}

// Calls f.template operator()<kDim>() with kDim = dim for the head dims the staged kernel is compiled for (its
// index arithmetic then folds to constants after the wait, on the decode step's critical path), else kDim = 0.
template <typename F>
void with_head_dim(int dim, F&& f) {
  if (dim == 64)
    f.template operator()<64>();
  else if (dim == 128)
    f.template operator()<128>();
  else
    f.template operator()<0>();
}

// paged_attention (fresh == nullptr) and paged_decode_attention on the staged kernel (+ combine); with kProject
// (several splits, launch_split_projected's plan) the combine is paged_combine_projected_kernel, `projected_smem`
// bytes a CTA.
template <typename T, int R, bool kFused, bool kProject = false>
void launch_staged_rows(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                        cudaStream_t stream, size_t projected_smem = 0) {
  const int device = dev.index;
  const int64_t rows = tokens * a.q_heads;
  const size_t smem = plan_staged<T, R>(a, tokens, max_context, sms);
  const int64_t n_split = a.n_split;
  const dim3 grid(static_cast<unsigned>(tokens * a.kv_heads * a.row_blocks), static_cast<unsigned>(n_split));
  if (n_split == 1) {
    with_head_dim(a.dim, [&]<int kDim>() {
      raise_smem_limit<paged_staged_kernel<T, R, kDim, true, kFused>>(kMaxStagedSmem, device);
      launch_chained(paged_staged_kernel<T, R, kDim, true, kFused>, grid, kStagedThreads, smem, stream, device, a,
                     freq);
    });
    return;
  }
  const Tensor part_o = Tensor::empty({rows * n_split * a.dim}, DType::f32, dev);
  const Tensor part_m = Tensor::empty({rows * n_split}, DType::f32, dev);
  const Tensor part_l = Tensor::empty({rows * n_split}, DType::f32, dev);
  a.part_o = part_o.data<float>();
  a.part_m = part_m.data<float>();
  a.part_l = part_l.data<float>();
  with_head_dim(a.dim, [&]<int kDim>() {
    raise_smem_limit<paged_staged_kernel<T, R, kDim, false, kFused>>(kMaxStagedSmem, device);
    launch_chained(paged_staged_kernel<T, R, kDim, false, kFused>, grid, kStagedThreads, smem, stream, device, a, freq);
  });
  if constexpr (kProject) {
    launch_chained_in_clusters(static_cast<unsigned>(a.q_heads), paged_combine_projected_kernel<T>,
                               static_cast<unsigned>(rows), kSmallThreads, projected_smem, stream, device, a);
    return;
  }
  const size_t combine_smem = (n_split + 32) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  launch_chained(paged_combine_kernel<T>, blocks, kSmallThreads, combine_smem, stream, device, a, rows);
}

// Rows per CTA: a whole GQA group (up to 8 query heads share each staged key) when the grid fills the GPU
// anyway, through many tokens or a long context's splits; one query head per CTA when tokens x kv heads is
// small and the context fits one chunk (a batch-1 decode step: 2 CTAs of 8 rows on 132 SMs otherwise), so
// each CTA does an eighth of the score and P.V work and the group's heads run side by side (the K/V rows they
// share come from L2 after the first).
bool one_head_per_cta(const PagedArgs& a, int64_t tokens, int64_t max_context, int sms) {
  const int64_t grouped_ctas = tokens * a.kv_heads * ((a.group + kRowsPerCta - 1) / kRowsPerCta);
  return a.group > 1 && grouped_ctas < sms && max_context <= kMaxChunk;
}

template <typename T, bool kFused>
void launch_staged(const PagedArgs& a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                   cudaStream_t stream) {
  if (one_head_per_cta(a, tokens, max_context, sms)) {
    launch_staged_rows<T, 1, kFused>(a, freq, tokens, max_context, sms, dev, stream);
  } else {
    launch_staged_rows<T, kRowsPerCta, kFused>(a, freq, tokens, max_context, sms, dev, stream);
  }
}

std::atomic<int64_t> g_projected_launches{0};

// MICROLLM_ATTENTION_O=0 keeps the o projection in its own kernel (an A/B switch); read once.
bool projection_fused() {
  static const bool on = detail::switch_from_environment("MICROLLM_ATTENTION_O");
  return on;
}

// Clusters a token of the projected kernel gets (every cluster computes the token's attention and its share of
// the o projection's columns, staged in shared memory): the most that keep the grid within half the SMs with at
// most kMaxStagedProjection bytes of rows a CTA; else 1 (rows streamed through L2). Measured in the model
// (Qwen2.5-0.5B tg128, 2026-12-01, docs/perf/inference.md): batch 1 with 4 replicas 1,463-1,466 tok/s against
// 1,412-1,414 with one (the policy takes 4: 56 CTAs, 28 KB each); a sweep of the first build gave 2 / 3 / 4 / 5 /
// 6 / 8 replicas 1,389 / 1,420 / 1,447 / 1,442 / 1,404 / 1,391 against 1,424 for one cluster, and batch 2 with
// 2 / 3 / 4: 2,597 / 2,660 / 2,626 against 2,690 with one (the policy takes 1).
// MICROLLM_ATTENTION_O_REPLICAS=R (1..kMaxReplicas) forces R (an A/B switch; read once).
int projection_replicas(int64_t tokens, int64_t q_heads, int64_t hidden, int64_t row_bytes, int sms) {
  static const int forced = detail::count_from_environment("MICROLLM_ATTENTION_O_REPLICAS", 1, kMaxReplicas);
  if (forced > 0) return forced;
  int replicas = 1;
  for (int r = 2; r <= kMaxReplicas && tokens * q_heads * r <= sms / 2; ++r) {
    if ((hidden + q_heads * r - 1) / (q_heads * r) * row_bytes <= kMaxStagedProjection) replicas = r;
  }
  return replicas;
}

// Whether clusters of `cluster` CTAs of `kernel` with `smem` bytes each can run on `device` (a GPC must hold
// them at once); asked once per (kernel, device, cluster, smem).
template <typename Kernel>
bool clusters_fit(Kernel kernel, int device, unsigned cluster, size_t smem, int threads = kStagedThreads) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, unsigned, size_t>, bool> answers;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::tuple{reinterpret_cast<const void*>(kernel), device, cluster, smem};  // one block size each
  if (const auto it = answers.find(key); it != answers.end()) return it->second;
  MICROLLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_memory_optin(device)));
  MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {cluster, 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int active = 0;
  MICROLLM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&active, kernel, &config));
  return answers[key] = active > 0;
}

// paged_decode_attention_projected in one kernel (kProject): where launch_staged would take one query head per
// CTA and one split, the token's query heads fit a cluster (at most 16 CTAs) that the GPU can hold, and within
// kMaxProjectedTokens and kMaxStagedProjection / kMaxStreamedProjection. Returns false, having launched nothing,
// anywhere else.
template <typename T>
bool launch_projected(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, int device,
                      cudaStream_t stream) {
  constexpr int kMaxClusterCtas = 16;  // sm_90's largest (non-portable) cluster
  if (!projection_fused() || compute_capability(device) < 90 || tokens > kMaxProjectedTokens ||
      !one_head_per_cta(a, tokens, max_context, sms) || a.q_heads > kMaxClusterCtas) {
    return false;
  }
  const size_t base = plan_staged<T, 1>(a, tokens, max_context, sms);
  const int64_t row_bytes = int64_t{a.o_in} * static_cast<int64_t>(sizeof(T));
  a.replicas = projection_replicas(tokens, a.q_heads, a.hidden, row_bytes, sms);
  a.o_cols = static_cast<int>((a.hidden + int64_t{a.q_heads} * a.replicas - 1) / (int64_t{a.q_heads} * a.replicas));
  const int64_t rows_bytes = a.o_cols * row_bytes;
  if (rows_bytes > (a.replicas > 1 ? kMaxStagedProjection : kMaxStreamedProjection)) return false;
  if (a.n_split != 1 || a.o_cols > 32 * kStagedWarps) return false;  // project_rows: a lane per row of a warp
  a.proj_offset = static_cast<int>((base + 15) / 16 * 16);
  const size_t smem = static_cast<size_t>(a.proj_offset) + static_cast<size_t>(a.dim + a.o_in) * sizeof(T) +
                      static_cast<size_t>(a.replicas > 1 ? rows_bytes : 0);
  if (smem > static_cast<size_t>(max_shared_memory_optin(device))) return false;
  void (*kernel)(PagedArgs, RopeFreq) = nullptr;
  with_head_dim(a.dim, [&]<int kDim>() {
    kernel = a.replicas > 1 ? paged_staged_kernel<T, 1, kDim, true, true, true, true>
                            : paged_staged_kernel<T, 1, kDim, true, true, true, false>;
  });
  const auto cluster = static_cast<unsigned>(a.q_heads);
  if (!clusters_fit(kernel, device, cluster, smem)) return false;
  const OpScope scope("paged_decode_attention_projected", device, stream);  // declined calls time their own ops
  const dim3 grid(static_cast<unsigned>(tokens * a.q_heads), static_cast<unsigned>(a.replicas));
  launch_chained_in_clusters(cluster, kernel, grid, kStagedThreads, smem, stream, device, a, freq);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// paged_decode_attention_projected past one split: where launch_staged's plan has several splits (a context past
// one chunk), at most kMaxProjectedTokens tokens whose query heads fit a cluster, and each CTA's o_cols rows fit
// kMaxStreamedProjection: the splits, then paged_combine_projected_kernel in place of the combine kernel and the
// o GEMV. Returns false, having launched nothing, anywhere else.
template <typename T>
bool launch_split_projected(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                            cudaStream_t stream) {
  constexpr int kMaxClusterCtas = 16;
  const int device = dev.index;
  if (!projection_fused() || compute_capability(device) < 90 || tokens > kMaxProjectedTokens ||
      a.q_heads > kMaxClusterCtas || one_head_per_cta(a, tokens, max_context, sms)) {
    return false;  // (one head a CTA: one split, launch_projected's)
  }
  PagedArgs plan = a;
  plan_staged<T, kRowsPerCta>(plan, tokens, max_context, sms);
  a.replicas = 1;
  a.o_cols = (a.hidden + a.q_heads - 1) / a.q_heads;
  const int64_t rows_bytes = int64_t{a.o_cols} * a.o_in * static_cast<int64_t>(sizeof(T));
  if (plan.n_split == 1 || rows_bytes > kMaxStreamedProjection || a.o_cols > 32 * (kSmallThreads / 32)) return false;
  a.proj_offset = static_cast<int>(((plan.n_split + 32) * sizeof(float) + 15) / 16 * 16);
  const size_t smem = static_cast<size_t>(a.proj_offset) + static_cast<size_t>(a.dim + a.o_in) * sizeof(T);
  const auto cluster = static_cast<unsigned>(a.q_heads);
  if (smem > static_cast<size_t>(max_shared_memory_optin(device)) ||
      !clusters_fit(paged_combine_projected_kernel<T>, device, cluster, smem, kSmallThreads)) {
    return false;
  }
  const OpScope scope("paged_decode_attention_projected", device, stream);
  launch_staged_rows<T, kRowsPerCta, true, true>(a, freq, tokens, max_context, sms, dev, stream, smem);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The arguments every attention kernel reads.
PagedArgs attention_args(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                         const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                         const Tensor& out, uint64_t* error_word) {
  PagedArgs a{};
  a.q = q.data_ptr();
  a.k_pool = k_pool.data_ptr();
  a.v_pool = v_pool.data_ptr();
  a.tables = block_tables.data<int32_t>();
  a.seq_ids = seq_ids.data<int32_t>();
  a.positions = positions.data<int32_t>();
  for (int d = 0; d < 3; ++d) a.q_stride[d] = q.stride(d);
  for (int d = 0; d < 4; ++d) {
    a.k_stride[d] = k_pool.stride(d);
    a.v_stride[d] = v_pool.stride(d);
  }
  a.table_stride[0] = block_tables.stride(0);
  a.table_stride[1] = block_tables.stride(1);
  a.seq_stride = seq_ids.stride(0);
  a.pos_stride = positions.stride(0);
  a.q_heads = static_cast<int>(q.size(1));
  a.kv_heads = static_cast<int>(k_pool.size(2));
  a.group = a.q_heads / a.kv_heads;
  a.dim = static_cast<int>(q.size(2));
  a.block_size = static_cast<int>(k_pool.size(1));
  a.num_blocks = static_cast<int>(std::min<int64_t>(k_pool.size(0), INT32_MAX));  // i32 block ids
  a.num_seqs = static_cast<int>(std::min<int64_t>(block_tables.size(0), INT32_MAX));
  a.max_context = static_cast<int>(max_context);  // the op checked it fits i32
  a.scale = static_cast<float>(scale);
  a.out = out.data_ptr();
  a.error_word = error_word;
  return a;
}

// A decode step's new k, v [N, Hkv, D] (before the rotary embedding), their slots and the rotary pairs.
void set_new_kv(PagedArgs& a, const Tensor& k, const Tensor& v, const Tensor& slots, const RopeParams& rope,
                int64_t dim) {
  a.k_new = k.data_ptr();
  a.v_new = v.data_ptr();
  for (int d = 0; d < 3; ++d) {
    a.k_new_stride[d] = k.stride(d);
    a.v_new_stride[d] = v.stride(d);
  }
  a.slots = slots.data<int32_t>();
  a.slot_stride = slots.stride(0);
  const bool split_half = rope.layout == RopeLayout::split_half;
  a.pair_step = split_half ? 1 : 2;
  a.partner = split_half ? static_cast<int>(dim / 2) : 1;
}

}  // namespace

int64_t projected_launches() { return g_projected_launches.load(std::memory_order_relaxed); }

}  // namespace cuda_kernels::paged

using namespace cuda_kernels;

void CudaBackend::paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                  const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                  double scale, int64_t max_context, const Tensor& out) {
  OpScope scope("paged_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  namespace pg = paged;
  const pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context,
                                             out, detail::cuda_error_word(device_));
  const int64_t tokens = q.size(0);
  const bool fast = pg::staged_fits(q, k_pool, v_pool, max_context);
  visit_float(q.dtype(), "paged_attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("paged_attention", DType::f64);  // the op allows f32/f16/bf16 pools only
    } else if (fast) {
      pg::launch_staged<T, false>(a, pg::RopeFreq{}, tokens, max_context,
                                  multiprocessor_count(launch.device), out.device(), launch.stream);
    } else {
      const size_t smem = pg::kSimpleKeys * sizeof(int64_t) + (2 * a.dim + pg::kSimpleKeys + 32) * sizeof(float);
      if (smem > 48 * 1024) {
        MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(pg::paged_simple_kernel<T>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      }
      pg::paged_simple_kernel<T>
          <<<static_cast<unsigned>(tokens * a.q_heads), pg::kSmallThreads, smem, launch.stream>>>(a);
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                         const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                         const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                         double scale, int64_t max_context, const Tensor& out) {
  namespace pg = paged;
  const int64_t tokens = q.size(0), dim = q.size(2);
  if (!pg::staged_fits(q, k_pool, v_pool, max_context)) {  // the separate ops, one after the other
    Backend::paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                    max_context, out);
    return;
  }
  OpScope scope("paged_decode_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out,
                                       detail::cuda_error_word(device_));
  pg::set_new_kv(a, k, v, slots, rope, dim);
  const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, dim);
  visit_float(q.dtype(), "paged_decode_attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("paged_decode_attention", DType::f64);
    } else {
      pg::launch_staged<T, true>(a, freq, tokens, max_context, multiprocessor_count(launch.device),
                                 out.device(), launch.stream);
    }
  });
}

// One kernel where launch_projected takes the shapes (16-bit weights in 16-byte aligned rows); otherwise the
// composition: paged_decode_attention, then the decode GEMV or cuBLASLt with the addend.
void CudaBackend::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                                   const Tensor& slots, const Tensor& block_tables,
                                                   const Tensor& seq_ids, const Tensor& positions, double scale,
                                                   int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                                   const Tensor& out) {
  namespace pg = paged;
  const int64_t tokens = q.size(0), dim = q.size(2);
  const bool sixteen_bit = q.dtype() == DType::bf16 || q.dtype() == DType::f16;
  const bool weight_rows = rows::rows_aligned16(o_weight) && o_weight.size(1) % 8 == 0;  // whole 16-byte packs
  if (sixteen_bit && weight_rows && pg::staged_fits(q, k_pool, v_pool, max_context)) {
    Launch launch(out);
    pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out,
                                         detail::cuda_error_word(device_));
    pg::set_new_kv(a, k, v, slots, rope, dim);
    a.out = nullptr;  // the attention's output stays in shared memory
    a.o_weight = o_weight.data_ptr();
    a.o_weight_stride = o_weight.stride(0);
    a.addend = addend.defined() ? addend.data_ptr() : nullptr;
    a.proj_out = out.data_ptr();
    a.hidden = static_cast<int>(o_weight.size(0));
    a.o_in = static_cast<int>(o_weight.size(1));
    const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, dim);
    bool launched = false;
    const int sms = multiprocessor_count(launch.device);
    if (q.dtype() == DType::bf16) {
      launched =
          pg::launch_projected<__nv_bfloat16>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
          pg::launch_split_projected<__nv_bfloat16>(a, freq, tokens, max_context, sms, out.device(), launch.stream);
    } else {
      launched = pg::launch_projected<__half>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
                 pg::launch_split_projected<__half>(a, freq, tokens, max_context, sms, out.device(), launch.stream);
    }
    if (launched) return;
  }
  Backend::paged_decode_attention_projected(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions,
                                            scale, max_context, o_weight, addend, out);
}

}  // namespace microllm
