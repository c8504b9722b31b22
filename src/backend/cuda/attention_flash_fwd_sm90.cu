// Flash attention forward on Hopper (sm_90a), for bf16/f16 at head dim 64 and 128: FlashAttention-3's design.
//
// The algorithm is the mma.sync kernel's (attention_flash_fwd.cu: online softmax in registers in log2 units,
// the causal early exit, split keys and their combine, attention_flash_fwd.cuh); what changes is who feeds
// the tensor cores. There each warp loads every K and V fragment it multiplies into registers with ldmatrix,
// and shared memory, not the tensor cores, bounds it. Here a CTA of three
// warpgroups works on 128 query rows of one head:
//   - Warpgroup 0, the producer: one thread issues the Tensor Memory Accelerator's copies (cp.async.bulk.tensor,
//     tensor maps from tensor_map.h) of the CTA's Q rows and of each key tile's K and V into a ring of STAGES
//     stages. A stage has a "full" mbarrier its copies complete (by bytes) and an "empty" one the consumers' warps
//     arrive on once their P V of it is done. TMA writes the 128-byte-swizzled panels wgmma reads
//     (attention_wgmma.cuh) and fills rows past a tensor's end with zeros, so padding never feeds the MMA garbage.
//   - Warpgroups 1 and 2, the consumers, 64 query rows each, multiply straight from shared memory:
//       S [64 x BC] = Q K^T   wgmma m64nBCk16, D/16 steps, Q and K by descriptor
//       online softmax on the S accumulators (a thread holds 2 rows x BC/4 columns; a row's 4 lanes shuffle)
//       O [64 x D] += P V     wgmma m64nDk16, BC/16 steps, P from registers (the S accumulators re-packed, as in
//                             the mma.sync kernel), V by descriptor, transposed (MN-major)
// Three overlaps keep the tensor cores busy, as in FlashAttention-3:
//   - the producer's copies run ahead of the consumers by up to STAGES - 1 tiles (no barrier of the whole CTA
//     in the loop);
//   - within a consumer, tile j's S and tile j - 1's P V are issued together, and tile j's softmax runs while the
//     tensor cores finish P V (software pipelining);
//   - between the consumers (ping-pong): a warpgroup issues its products only once the other has issued its own
//     (named barriers kSchedBarrier + warpgroup), so one's softmax runs while the other's products occupy the
//     tensor cores.
// The producer hands its registers to the consumers (setmaxnreg: 24 against 240 a thread), whose S, O and P
// (160 registers at D 128) would not fit a third of the register file each.
//
// Tiles: 128 keys; D 128 in three stages (one CTA an SM: 224 KB), D 64 in four, one CTA an SM (two CTAs an SM
// of 64-key tiles spill at their 104-register budget); docs/perf/kernels.md#flash-forward-sm90.
//
// The wgmma are asynchronous only as long as ptxas can prove no other instruction touches an accumulator
// before its wait; otherwise it serializes every wgmma of the kernel (ptxas -v: "C7514 ... wgmma.mma_async
// instructions are serialized"), silently: the results stay right. tools/check_wgmma_async.sh (run by .ci/run)
// fails if C7514 appears (docs/perf/kernels.md#flash-forward-sm90: when it happened).
//
// The scale rides in the exponent's FMA, so this kernel needs scale > 0 (flash_forward checks; the mma.sync
// kernel takes any scale).
#include <type_traits>

#include "attention_flash_fwd.cuh"
#include "attention_kernels.h"
#include "attention_wgmma.cuh"
#include "microllm/backend/backend.h"
#include "tensor_map.h"

namespace microllm::cuda_kernels::attention {
namespace flash_fwd {
namespace {

using namespace attn;

// Device code of sm_90a only: other passes (the host, compute_90 PTX) see the kernel as a trap.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Byte offset of 16-byte chunk `ch` of row r in the panels of a tile of `rows` rows (attention_wgmma.cuh).
__device__ __forceinline__ uint32_t panel_offset(int r, int ch, int rows) {
  return static_cast<uint32_t>((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

// Masks keys past the end, the diagonal or the window (on tiles that need it) with -inf. s[4 j + e] is row
// g + 8 (e / 2), key key0 + 8 j + 2 t4 + e % 2 of this warp's 16 rows from q_row0. S stays unscaled: softmax_tile
// folds the scale in.
template <int BC>
__device__ __forceinline__ void mask_tile(float (&s)[BC / 2], const FwdArgs& a, int key0, int q_row0, int g, int t4) {
  if (!tile_needs_mask(a, key0, BC, q_row0, q_row0 + 15)) return;
#pragma unroll
  for (int i = 0; i < BC / 2; ++i) {
    const int row = q_row0 + g + ((i >> 1) & 1) * 8;
    const int col = key0 + (i >> 2) * 8 + 2 * t4 + (i & 1);
    if (!key_visible(a, row, col)) s[i] = -INFINITY;
  }
}

// 2^x on the MUFU unit, subnormal results flushed to 0 (exp2f's extra range handling costs instructions on
// every score; a probability under 2^-126 weighs nothing next to the row's largest, which is 1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One tile's online softmax on this thread's two rows (g: s[4 j], s[4 j + 1]; g + 8: s[4 j + 2], s[4 j + 3]; a
// row's four lanes share the max by shuffles): s becomes P = 2^(s scale_log2 - m), the running max m (log2
// units) and the per-lane sum move on, and corr[hf] is the factor the row's earlier O must be scaled by. The
// max and the sum reduce in four independent chains (a dependent chain of BC / 4 operations otherwise), and
// the scale rides in the exponent's FMA (scale_log2 > 0, so the max of s is the max of the scaled scores).
template <int BC>
__device__ __forceinline__ void softmax_tile(float (&s)[BC / 2], float scale_log2, float (&row_max)[2],
                                             float (&row_sum)[2], float (&corr)[2]) {
  constexpr int J = BC / 8;  // columns pairs of a row a lane holds: s[4 j + 2 hf], s[4 j + 2 hf + 1]
  static_assert(J % 2 == 0, "two chains of pairs");
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float m4[4] = {s[2 * hf], s[2 * hf + 1], s[4 + 2 * hf], s[4 + 2 * hf + 1]};
#pragma unroll
    for (int j = 2; j < J; j += 2) {
      m4[0] = fmaxf(m4[0], s[4 * j + 2 * hf]);
      m4[1] = fmaxf(m4[1], s[4 * j + 2 * hf + 1]);
      m4[2] = fmaxf(m4[2], s[4 * j + 4 + 2 * hf]);
      m4[3] = fmaxf(m4[3], s[4 * j + 4 + 2 * hf + 1]);
    }
    float mx = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3])) * scale_log2;
    mx = fmaxf(mx, MICROLLM_SHFL_XOR(mx, 1));
    mx = fmaxf(mx, MICROLLM_SHFL_XOR(mx, 2));
    mx = fmaxf(mx, row_max[hf]);
    // -inf while the row has seen no key: subtract 0 so 2^(-inf - 0) = 0, never NaN.
    const float m_use = mx == -INFINITY ? 0.f : mx;
    corr[hf] = exp2_ftz(row_max[hf] - m_use);
    row_max[hf] = mx;
    float sum4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const float p0 = exp2_ftz(fmaf(s[4 * j + 2 * hf], scale_log2, -m_use));
      const float p1 = exp2_ftz(fmaf(s[4 * j + 2 * hf + 1], scale_log2, -m_use));
      s[4 * j + 2 * hf] = p0;
      s[4 * j + 2 * hf + 1] = p1;
      sum4[2 * (j & 1)] += p0;
      sum4[2 * (j & 1) + 1] += p1;
    }
    row_sum[hf] = row_sum[hf] * corr[hf] + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));  // summed over lanes at the end
  }
}

// P in 16 bits as the A fragments of O += P V: S's accumulators of keys 16 kc..16 kc + 15 are k step kc's.
template <typename T, int BC>
__device__ __forceinline__ void pack_p(const float (&s)[BC / 2], uint32_t (&p)[BC / 16][4]) {
#pragma unroll
  for (int kc = 0; kc < BC / 16; ++kc) {
    p[kc][0] = pack2<T>(s[8 * kc + 0], s[8 * kc + 1]);  // (g,     keys 2t..)
    p[kc][1] = pack2<T>(s[8 * kc + 2], s[8 * kc + 3]);  // (g + 8, keys 2t..)
    p[kc][2] = pack2<T>(s[8 * kc + 4], s[8 * kc + 5]);  // (g,     keys 2t + 8..)
    p[kc][3] = pack2<T>(s[8 * kc + 6], s[8 * kc + 7]);  // (g + 8, keys 2t + 8..)
  }
}

// Issues S = Q K^T for one key tile (this warpgroup's Q rows at q_rows; K panels at k_tile).
template <typename T, int D, int BR, int BC>
__device__ __forceinline__ void issue_qk(float (&s)[BC / 2], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t panel = kk / 4, k_bytes = (kk % 4) * 32;
    wgmma_ss<T, BC>(s, wgmma_desc(q_rows + panel * BR * 128 + k_bytes, 16, 1024),
                    wgmma_desc(k_tile + panel * BC * 128 + k_bytes, 16, 1024), kk > 0);
  }
}
// Issues O += P V for one key tile (V panels at v_tile, read transposed).
template <typename T, int D, int BC>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[BC / 16][4], uint32_t v_tile) {
#pragma unroll
  for (int kc = 0; kc < BC / 16; ++kc) wgmma_rs<T, D>(o, p[kc], wgmma_desc(v_tile + kc * 16 * 128, BC * 128, 1024), 1);
}

// O's rows g and g + 8 scaled to the new running max (softmax_tile's corr).
template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---- the kernel: a TMA producer and two consumers taking turns (the header comment) ----
template <int D, int BC, int STAGES>
struct Sm90Tile {
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups, one CTA an SM
  static constexpr int kRows = 128;     // BR: 64 query rows a consumer
  // Registers a thread after the hand-over (setmaxnreg): the producer's 128 threads give theirs to the consumers'
  // 256, whose S, O and P need ~160 at D 128.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the registers handed over exist");
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kKvBytes = BC * D * 2;  // one K or V tile: D / 64 panels of BC rows
  static constexpr int kSmemBytes = kQBytes + 2 * STAGES * kKvBytes + 1024;  // + room to align to 1024
  static_assert(D % 64 == 0 && (BC == 64 || BC == 128) && STAGES >= 2, "whole panels; S is m64n64 or m64n128");
};
[[maybe_unused]] constexpr int kSchedBarrier = 1;  // named barriers 1 and 2: consumer warpgroup 0's and 1's turn

template <typename T, int D, int BC, int STAGES>
__global__ void __launch_bounds__(Sm90Tile<D, BC, STAGES>::kThreads, 1)
    flash_forward_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map, const FwdArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = Sm90Tile<D, BC, STAGES>;
  constexpr int BR = Tile::kRows, CH = D / 8;
  __shared__ __align__(8) uint64_t q_full, kv_full[STAGES], kv_empty[STAGES];
  extern __shared__ unsigned char flash_sm90_smem[];
  const uint32_t smem0 = smem_u32(flash_sm90_smem);
  const uint32_t sQ = (smem0 + 1023u) & ~1023u;  // 1024-aligned: the swizzle pattern's period
  const uint32_t sKV = sQ + Tile::kQBytes;       // STAGES x (K tile, V tile)
  unsigned char* const q_tile = flash_sm90_smem + (sQ - smem0);

  const int b = blockIdx.x / a.q_heads, h = blockIdx.x % a.q_heads, hk = h / a.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;  // the longest (causal) blocks are scheduled first
  const CtaTiles tiles = cta_tiles<BC>(a, q0, BR);
  if (tiles.begin >= tiles.end) return;
  const int tile_begin = tiles.begin, tile_end = tiles.end;
  // Tile jt's K and V live in stage (jt - tile_begin) % STAGES, its use number (jt - tile_begin) / STAGES.
  auto stage = [&](int jt) { return (jt - tile_begin) % STAGES; };
  auto use_parity = [&](int jt) { return static_cast<unsigned>((jt - tile_begin) / STAGES) & 1u; };
  auto k_tile = [&](int jt) { return sKV + static_cast<uint32_t>(stage(jt)) * 2 * Tile::kKvBytes; };
  auto full_bar = [&](int jt) { return smem_u32(&kv_full[stage(jt)]); };
  auto empty_bar = [&](int jt) { return smem_u32(&kv_empty[stage(jt)]); };

  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&q_full), 1);
    for (int i = 0; i < STAGES; ++i) {
      mbar_init(smem_u32(&kv_full[i]), 1);
      mbar_init(smem_u32(&kv_empty[i]), 8);  // the consumers' warps
    }
    mbar_fence_init();
  }
  __syncthreads();
  wait_for_prior_grids();  // launched chained in a captured prefill: q, k, v come from the kernel before

  if (threadIdx.x < 128) {  // the producer warpgroup; one thread issues every copy
    warpgroup_registers_down<Tile::kProducerRegs>();
    if (threadIdx.x == 0) {
      mbar_expect_bytes(smem_u32(&q_full), Tile::kQBytes);
      for (int p = 0; p < D / 64; ++p) tma_load_4d(sQ + p * BR * 128, &q_map, smem_u32(&q_full), 64 * p, q0, h, b);
      for (int jt = tile_begin; jt < tile_end; ++jt) {
        mbar_wait(empty_bar(jt), use_parity(jt) ^ 1);  // its last use released (a fresh barrier: at once)
        mbar_expect_bytes(full_bar(jt), 2 * Tile::kKvBytes);
        for (int p = 0; p < D / 64; ++p) {
          tma_load_4d(k_tile(jt) + p * BC * 128, &k_map, full_bar(jt), 64 * p, jt * BC, hk, b);
          tma_load_4d(k_tile(jt) + Tile::kKvBytes + p * BC * 128, &v_map, full_bar(jt), 64 * p, jt * BC, hk, b);
        }
      }
    }
    return;
  }

  warpgroup_registers_up<Tile::kConsumerRegs>();
  const int lane = threadIdx.x % 32, wg = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4;
  const int g = lane / 4, t4 = lane % 4;      // PTX groupID, threadID_in_group
  const int warp_row0 = wg * 64 + warp * 16;  // this warp's first row in the block
  float o[D / 2];  // O accumulators: o[4 j + e] is row g + 8 (e / 2), column 8 j + 2 t4 + e % 2
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g, g + 8; max in log2 units
  float corr[2];
  const uint32_t q_rows = sQ + static_cast<uint32_t>(wg * 64 * 128);  // this warpgroup's rows in panel 0
  uint32_t p[BC / 16][4];                                             // P of the tile before the one in S
  mbar_wait(smem_u32(&q_full), 0);
  if (wg == 1) named_arrive(kSchedBarrier, 256);  // warpgroup 0 goes first

  // One key tile (software-pipelined, the header comment): once the tile has landed and it is this warpgroup's
  // turn, issue tile jt's S and tile jt - 1's P V, hand the turn over, run tile jt's softmax while the tensor
  // cores work, then release tile jt - 1's stage. The first tile, which has no P V before it, is its own instance
  // of the step, so that every commit closes a group of real wgmma: the wait for S must leave exactly the P V
  // group in flight (a commit after a wgmma issued only sometimes costs ptxas a placeholder wgmma on every tile).
  auto step = [&]<bool kFirst>(int jt) {
    mbar_wait(full_bar(jt), use_parity(jt));
    float s[BC / 2];
    named_sync(kSchedBarrier + wg, 256);  // this warpgroup's turn
    wgmma_fence();
    issue_qk<T, D, BR, BC>(s, q_rows, k_tile(jt));
    wgmma_commit();
    if constexpr (!kFirst) {
      issue_pv<T, D, BC>(o, p, k_tile(jt - 1) + Tile::kKvBytes);
      wgmma_commit();
    }
    named_arrive(kSchedBarrier + 1 - wg, 256);  // the other's turn
    if constexpr (kFirst) {
      wgmma_wait<0>();  // S
    } else {
      wgmma_wait<1>();  // S (P V may still run: it was committed last)
    }
    wgmma_fence_operands(s);
    mask_tile<BC>(s, a, jt * BC, q0 + warp_row0, g, t4);
    softmax_tile<BC>(s, a.scale_log2, row_max, row_sum, corr);
    if constexpr (!kFirst) {
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      if (lane == 0) mbar_arrive(empty_bar(jt - 1));  // this warp is done with tile jt - 1's stage
    }
    rescale<D>(o, corr);
    pack_p<T, BC>(s, p);
  };
  step.template operator()<true>(tile_begin);
  for (int jt = tile_begin + 1; jt < tile_end; ++jt) step.template operator()<false>(jt);
  named_sync(kSchedBarrier + wg, 256);
  wgmma_fence();
  issue_pv<T, D, BC>(o, p, k_tile(tile_end - 1) + Tile::kKvBytes);
  wgmma_commit();
  // Warpgroup 1's last turn has no other after it: each warpgroup's syncs now match the other's arrives (warpgroup
  // 1's first one above included), so no named barrier is left half arrived when the CTA exits.
  if (wg == 0) named_arrive(kSchedBarrier + 1, 256);
  wgmma_wait<0>();
  wgmma_fence_operands(o);

  if (tiles.partial) {  // this split's rows for flash_combine_kernel: unnormalized sums and (max, sum)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = quad_sum(row_sum[hf]);
      const int row = q0 + warp_row0 + g + hf * 8;
      if (row < a.q_len) {
        write_split_partial<D>(a, row, row_max[hf], l, t4, [&](int j, int e) { return o[4 * j + 2 * hf + e]; });
      }
    }
    return;
  }

  // ---- epilogue: O / l through this warp's own rows of the Q panels (no other warp reads them), lse ----
  T* out = out_row<T>(a, b, h, 0);
  float* lse = a.lse + (static_cast<int64_t>(b) * a.q_heads + h) * a.q_len;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float l = quad_sum(row_sum[hf]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row_local = warp_row0 + g + hf * 8;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(q_tile + panel_offset(row_local, j, BR) + 4 * t4) =
          pack2<T>(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    }
    const int row = q0 + row_local;
    if (t4 == 0 && row < a.q_len) lse[row] = row_lse(row_max[hf], l);
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < 16 * CH / 32; ++n) {
    const int c = n * 32 + lane;
    const int r = warp_row0 + c / CH, ch = c % CH;
    if (q0 + r < a.q_len) {
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(q0 + r) * a.out_stride[2] + ch * 8) =
          *reinterpret_cast<const uint4*>(q_tile + panel_offset(r, ch, BR));
    }
  }
#else
  __trap();  // built without sm_90a machine code: flash_forward_uses_wgmma() keeps it from launching
#endif
}

// The tensor map of q, k or v ([batch, heads, len, D] at `stride`: batch, head, position, in elements) read in
// boxes of one head's `box_rows` positions x 64 columns.
CUtensorMap heads_map(const void* base, DType dtype, int64_t batch, int64_t heads, int64_t len, int d,
                      const int64_t (&stride)[3], int box_rows) {
  const int64_t dims[4] = {d, len, heads, batch};
  int64_t byte_strides[3] = {stride[2] * 2, stride[1] * 2, stride[0] * 2};
  // A dimension of one element is never stepped along, and views may give it any stride (0 too): give the driver
  // one it takes, the dimensions below it packed.
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1) byte_strides[i] = i == 0 ? int64_t{d} * 2 : byte_strides[i - 1] * dims[i];
  }
  const uint32_t box[4] = {64, static_cast<uint32_t>(box_rows), 1, 1};
  return swizzled_map("attention", base, dtype, 4, dims, byte_strides, box);
}

template <typename T, int D, int BC, int STAGES>
void launch(FwdArgs& a, int64_t batch, cudaStream_t stream, int device) {
  using Tile = Sm90Tile<D, BC, STAGES>;
  static_assert(Tile::kSmemBytes + 1024 <= 227 * 1024, "the tile fits an sm_90 SM's shared memory");
  constexpr auto kernel = flash_forward_sm90_kernel<T, D, BC, STAGES>;
  raise_smem_limit<kernel>(Tile::kSmemBytes, device);
  const DType dtype = std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::f16;
  const int kv_heads = a.q_heads / a.group;
  const CUtensorMap q_map = heads_map(a.q, dtype, batch, a.q_heads, a.q_len, D, a.q_stride, Tile::kRows);
  const CUtensorMap k_map = heads_map(a.k, dtype, batch, kv_heads, a.kv_len, D, a.k_stride, BC);
  const CUtensorMap v_map = heads_map(a.v, dtype, batch, kv_heads, a.kv_len, D, a.v_stride, BC);
  launch_split<T, D, Tile::kRows, BC>(
      [&](dim3 grid) {
        launch_chained(kernel, grid, Tile::kThreads, Tile::kSmemBytes, stream, device, q_map, k_map, v_map, a);
      },
      /*ctas_per_sm=*/1, a, batch, stream, device);
}

}  // namespace

void launch_sm90(FwdArgs& a, int64_t batch, int head_dim, bool bf16, cudaStream_t stream, int device) {
  // Tiles (the header comment): 128-key tiles, one CTA an SM; three stages at D 128, four at D 64.
  auto run = [&]<typename T>() {
    if (head_dim == 64)
      launch<T, 64, 128, 4>(a, batch, stream, device);
    else
      launch<T, 128, 128, 3>(a, batch, stream, device);
  };
  if (bf16)
    run.template operator()<__nv_bfloat16>();
  else
    run.template operator()<__half>();
}

}  // namespace flash_fwd

bool flash_forward_uses_wgmma(int device) { return flash_wgmma() && sm90a_kernels(device); }

}  // namespace microllm::cuda_kernels::attention
