// A paged KV cache's operators, for continuous batching and decode steps replayed from a CUDA graph.
//
// One layer's cache is two pools k_pool, v_pool [num_blocks, block_size, Hkv, D] (f32, f16 or bf16; on the
// CPU f64 too), token-major inside a block: token slot s lives in block s / block_size, row s % block_size.
// A sequence owns blocks in any order, listed in its row of a block table. Everything that changes from one step to
// the next (slots, block tables, sequence ids, positions) is an i32 tensor on the pools' device, read by
// the kernels on the device: no host reads, no host-side kernel argument, so a captured graph replays
// with new values. The host checks only shapes, dtypes and devices.
//
// Out-of-range slots, block ids, sequence ids and positions are the caller's contract. The CPU reference
// throws IndexError naming the row; CUDA kernels never read or write out of bounds because of them: they
// skip the bad row, key or block and report an IndexError at the next synchronization (docs/CUDA.md).
#pragma once

#include <cstdint>
#include <utility>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm {

// pool[slots[n]] = k[n] (and v[n]) for every n with slots[n] >= 0; rows with a negative slot (padding)
// are skipped. k, v [N, Hkv, D], any strides (e.g. a [B, T, Hkv, D] projection viewed as [B*T, Hkv, D])
// and any float dtype (converted to the pools' dtype); slots i32 [N]. Writes the pools in place.
void paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v, const Tensor& slots);

// Attention of N query tokens against their sequences' cached keys and values:
//   q [N, Hq, D] any strides, the pools' dtype, Hq % Hkv == 0 (query head h reads kv head h / (Hq / Hkv));
//   block_tables i32 [S, max_blocks]: row s lists sequence s's blocks in order;
//   seq_ids i32 [N]: each query's row of block_tables;
//   positions i32 [N]: query n attends to keys 0..positions[n] of its sequence, inclusive (its own k/v
//     already written with paged_kv_write); positions[n] < 0 marks a padding row, whose output is 0.
// scale 0 = 1 / sqrt(D). max_context: an upper bound on positions + 1 that the host knows (0 = max_blocks
// * block_size); the CUDA kernel sizes its grid from it, so a graph captured with a generous bound stays
// valid as the sequences grow (splits past a sequence's length exit at once). A position + 1 past it is
// an error. window > 0: a sliding window, query n attends to keys positions[n] - window + 1 .. positions[n] only
// (`window` keys with its own; 0: every earlier key). Returns out [N, Hq, D] in q's dtype (f32 accumulation).
Tensor paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                       const Tensor& seq_ids, const Tensor& positions, double scale = 0, int64_t max_context = 0,
                       int64_t window = 0);

// The same into a given contiguous `out` [N, Hq, D] of q's dtype and device (a static buffer for CUDA
// graphs). `out` must not overlap q or the pools.
void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                     const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                     const Tensor& out, int64_t window = 0);

// One decode step's attention in one call: what rope(q), rope(k), paged_kv_write and paged_attention do in
// turn, for N tokens of N different sequences (one new token each). q [N, Hq, D], k and v [N, Hkv, D] are the
// projections before the rotary embedding (any strides, the pools' dtype, e.g. views of a fused QKV output);
// token n's q and k turn by `rope` at positions[n], its k and v go to slots[n], which must be the slot that
// block_tables gives position positions[n] of sequence seq_ids[n], and its q attends to keys
// 0..positions[n]. positions[n] < 0 marks a padding row: nothing written, output 0. scale, max_context, out and
// window as for paged_attention. The CUDA kernel does all of it in one launch (two past 256 keys or so): each
// token's new key and value reach the attention from registers, not back from the pool. The CPU reference
// is the composition of the four ops, and checks the slot and distinct-sequence contract (IndexError).
// qk_norm, where defined (Qwen3, Gemma 3): q and k are first normalized as qk_rms_norm normalizes them (ops/qk_norm.h),
// which the CUDA kernel does as it loads them where a head is at most 512 bytes (its bits).
void paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                            const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots, const Tensor& block_tables,
                            const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                            const Tensor& out, int64_t window = 0, const QkNormParams& qk_norm = {});

// paged_decode_attention followed by the attention's output projection, in one call: out [N, hidden] =
// addend + attention [N, Hq * D] @ o_weight^T, where attention is paged_decode_attention's output (rounded to
// q's dtype, as that op writes it) and the sum is linear_add's: f32 accumulation, the addend (e.g. the residual
// stream; undefined for none) added before the one rounding. o_weight [hidden, Hq * D] and addend [N, hidden] in
// q's dtype on q's device; out contiguous, overlapping none of the inputs. The arguments before o_weight are
// paged_decode_attention's. The CUDA kernel does all of it in one launch where a token's query heads fit one
// thread-block cluster and the projection's weight slices fit its budget (a batch-1 or -2 decode step of
// Qwen2.5-0.5B: docs/CUDA.md), in two past one split (a longer context: the splits, then their merge with the
// projection); otherwise, and on the CPU, it is the composition of the two ops.
void paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                      const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                      const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                      double scale, int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                      const Tensor& out, int64_t window = 0, const QkNormParams& qk_norm = {});

// A prefill chunk's rotary embedding and cache write in one call: what rope(q), rope(k) and paged_kv_write do
// in turn. q [B, T, Hq, D], k and v [B, T, Hkv, D] are the projections before the rotary embedding (any strides,
// the pools' dtype, e.g. views of a fused QKV output), Hq % Hkv == 0; positions [B, T] or [T] (i32/i64) as for
// rope(); slots i32 [B * T], token (b, t) at row b * T + t, negative for a row not to write. Returns the turned
// q and k, [B, T, Hq, D] and [B, T, Hkv, D] contiguous: the chunk's attention reads them; the turned k and v go to
// the pools. CUDA does it in one kernel for the split-half layout (the Hugging Face models') with 16-byte aligned
// rows; otherwise, and on the CPU, it is the composition of the three ops.
std::pair<Tensor, Tensor> paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& positions, const RopeParams& rope, const Tensor& k_pool,
                                              const Tensor& v_pool, const Tensor& slots);

// The end of a decode step that a CUDA graph replays, so that the next step needs no copy while its batch is
// the same: it moves the step's inputs on by one token on the device and hands the sampled ids to the host.
//   inputs i32 [3, B] contiguous: rows rotary positions, attention positions and slots of B decode rows, row b
//     of the batch reading row b of block_tables i32 [B, max_blocks]. A row with attention position p >= 0 moves
//     on: rotary position + 1, attention position p + 1, slot block_tables[b][(p + 1) / block_size] *
//     block_size + (p + 1) % block_size, or -1 once (p + 1) / block_size is past the table. A row with p < 0
//     (not fed) stays. The engine predicts the result with this op on the host (the same rule) and uploads
//     only when the next step wants something else.
//   ids i32 [N], outbox i32 [R, >= N] (memory the host reads: pinned and mapped for CUDA) and counter i32 [1],
//     all three on inputs' device, or all three undefined: outbox[counter % R][0, N) = ids, then counter += 1,
//     the counter read as unsigned (it wraps from 2^32 - 1 to 0, never negative).
//     With R = 2, two steps in flight write different rows; the host reads a row once its step has finished.
void paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size, const Tensor& ids = {},
                          const Tensor& outbox = {}, const Tensor& counter = {});

// A contiguous copy [length, Hkv, D] of the first `length` cached tokens of one sequence, whose blocks are
// block_table_row i32 [max_blocks] (length <= max_blocks * block_size): a prefill chunk runs the ordinary
// attention() over its sequence's earlier keys plus its own.
Tensor paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length);

}  // namespace microllm
