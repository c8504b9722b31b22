// Flash attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), for bf16/f16 at head dim 64 and 128.
//
// The algorithm is the mma.sync kernel's (attention_flash_fwd.cu: online softmax in registers in log2 units,
// the causal early exit, split keys and their combine, attention_flash_fwd.cuh); what changes is who feeds
// the tensor cores. There each warp loads every K and V fragment it multiplies into registers with ldmatrix,
// and shared memory, not the tensor cores, bounds it (~140 TFLOP/s at a batch-1 prefill). Here a warpgroup
// (128 threads, 64 query rows) multiplies straight from shared memory:
//   S [64 x BC] = Q K^T   wgmma m64nBCk16, D/16 steps, Q and K by descriptor
//   online softmax on the S accumulators (a thread holds 2 rows x BC/4 columns; a row's 4 lanes shuffle)
//   O [64 x D] += P V     wgmma m64nDk16, BC/16 steps, P from registers (the S accumulators re-packed, as in
//                         the mma.sync kernel), V by descriptor, transposed (MN-major)
// K and V tiles of BC keys stream through shared memory in three stages filled by cp.async (every thread
// copies), written straight into wgmma's 128-byte-swizzled panels (attention_wgmma.cuh) and handed to the
// async proxy that wgmma reads through (fence.proxy.async) before the barrier that publishes them.
// The loop is software-pipelined as in FlashAttention-3's intra-warpgroup overlap: tile j's S and tile
// j - 1's P V are issued together, and tile j's softmax runs while the tensor cores finish P V.
//
// Measured (H200, cuda_ops_bench attention_fwd against attention_fwd_mma, 2026-11-30 15:45 UTC, medians of
// 20; docs/perf/cuda-ops.md):
//   B1 T2048 D128 (R1-1.5B prefill): 91.4 us (mma.sync) -> 59.8 us; B8 T1024 D128 140.1 -> 110.1 us
//   B1 T2048 D64 (Qwen2.5-0.5B):     64.6 us -> 47.8 us;             B8 T1024 D64  98.9 -> 68.4 us
// Tiles, from a sweep of warpgroups x key tile (1 or 2 x 64 or 128) in the same call: two warpgroups a CTA
// (BR = 128 rows) sharing each K/V tile; D 64 with 64-key tiles (two CTAs an SM, 110 registers), D 128 with
// 128-key tiles (one CTA an SM, 232 registers). One warpgroup of 128 keys was best at D 64 batch 1 (44.0 us)
// and worst at batch 8 (83.9 us); the choice above is within 9% of the best everywhere measured. What was not
// tried: a TMA producer warp, and ping-pong between the warpgroups (FlashAttention-3's other two overlaps).
//
// The wgmma are asynchronous only as long as ptxas can prove no other instruction touches an accumulator
// before its wait. Until 2026-12-01 the first tile committed one group and waited for "all but one", so its
// softmax could read S while S was still being computed; ptxas saw that hazard and serialized every wgmma of
// the kernel (ptxas -v: "C7514 ... wgmma.mma_async instructions are serialized"; Nsight Compute: a wait after
// each HGMMA, 28% of the stall samples), which also kept the results right. tools/check_wgmma_async.sh (run
// by .ci/run) fails if C7514 comes back. Measured (2026-12-01 06:49 UTC, `cuda_ops_bench --reps 30
// --filter attention_fwd`, the serialized kernel against this one, two passes each): B1 T2048 D128 57.8 / 57.8
// -> 58.0 / 54.6 us, B8 T1024 D128 120.1 / 108.8 -> 104.7 / 102.3, B1 T2048 D64 51.2 / 49.8 -> 46.9 / 49.2,
// B8 T1024 D64 72.5 / 70.5 -> 66.9 / 65.8. Little: what bounds the kernel is not the tensor cores' queue.
// Measured and not kept (06:43 UTC): S of tile j + 1 and P V of tile j - 1 both in flight during tile j's
// softmax (two S register sets, four stages, 64-key tiles): D128 B1 T2048 58 -> 68-72 us, D64 47 -> 51-63.
//
// The scale rides in the exponent's FMA, so this kernel needs scale > 0 (flash_forward checks; the mma.sync
// kernel takes any scale).
#include "attention_flash_fwd.cuh"
#include "attention_kernels.h"
#include "attention_wgmma.cuh"
#include "microllm/backend/backend.h"

namespace microllm::cuda_kernels::attention {
namespace flash_fwd {
namespace {

using namespace attn;

template <int D, int BC, int NWG>
struct Sm90Tile {
  static constexpr int kThreads = NWG * 128;
  static constexpr int kRows = NWG * 64;         // BR
  static constexpr int kQBytes = kRows * D * 2;  // D / 64 panels of kRows rows
  static constexpr int kKvBytes = BC * D * 2;    // one K or V stage: D / 64 panels of BC rows
  static constexpr int kStages = 3;              // tiles j - 1 (P V), j (Q K^T), j + 1 (loading)
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 1024;  // + room to align to 1024
  static_assert(D % 64 == 0 && (BC == 64 || BC == 128), "whole panels; S is m64n64 or m64n128");
};

// Device code of sm_90a only: other passes (the host, compute_90 PTX) see the kernel as a trap.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Byte offset of 16-byte chunk `ch` of row r in the panels of a tile of `rows` rows (attention_wgmma.cuh).
__device__ __forceinline__ uint32_t panel_offset(int r, int ch, int rows) {
  return static_cast<uint32_t>((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

// ROWS x D tile -> wgmma's panels at `dst` (copy_rows_async: zero-filled past limit).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_panels(uint32_t dst, const T* src, int64_t stride, int row0, int limit) {
  copy_rows_async<ROWS, D, THREADS>(dst, src, stride, row0, limit,
                                    [](int r, int ch) { return panel_offset(r, ch, ROWS); });
}

// Masks keys past the end or the diagonal (on tiles that need it) with -inf. s[4 j + e] is row g + 8 (e / 2), key
// key0 + 8 j + 2 t4 + e % 2 of this warp's rows from q_row0. S stays unscaled: softmax_tile folds the scale in.
template <int BC>
__device__ __forceinline__ void mask_tile(float (&s)[BC / 2], const FwdArgs& a, int key0, int q_row0, int g, int t4) {
  if (!(key0 + BC > a.kv_len || (a.causal && key0 + BC - 1 > a.q_offset + q_row0))) return;
#pragma unroll
  for (int i = 0; i < BC / 2; ++i) {
    const int row = q_row0 + g + ((i >> 1) & 1) * 8;
    const int col = key0 + (i >> 2) * 8 + 2 * t4 + (i & 1);
    if (col >= a.kv_len || (a.causal && col > a.q_offset + row)) s[i] = -INFINITY;
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

template <typename T, int D, int BC, int NWG, int CTAS>
__global__ void __launch_bounds__(NWG * 128, CTAS) flash_forward_sm90_kernel(const FwdArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wait_for_prior_grids();  // launched chained in a captured prefill: q, k, v come from the kernel before
  using Tile = Sm90Tile<D, BC, NWG>;
  constexpr int BR = Tile::kRows, THREADS = Tile::kThreads, CH = D / 8, STAGES = Tile::kStages;
  extern __shared__ unsigned char flash_sm90_smem[];
  const uint32_t smem0 = smem_u32(flash_sm90_smem);
  const uint32_t sQ = (smem0 + 1023u) & ~1023u;                  // 1024-aligned: the swizzle pattern's period
  const uint32_t sKV = sQ + Tile::kQBytes;                       // STAGES x (K tile, V tile)
  unsigned char* const q_tile = flash_sm90_smem + (sQ - smem0);  // sQ as a generic pointer (epilogue)

  const int lane = threadIdx.x % 32, wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4;
  const int g = lane / 4, t4 = lane % 4;  // PTX groupID, threadID_in_group
  const int b = blockIdx.x / a.q_heads, h = blockIdx.x % a.q_heads, hk = h / a.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;  // the longest (causal) blocks are scheduled first
  const int warp_row0 = wg * 64 + warp * 16;         // this warp's first row in the block

  const T* qg = static_cast<const T*>(a.q) + b * a.q_stride[0] + h * a.q_stride[1];
  const T* kg = static_cast<const T*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const T* vg = static_cast<const T*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];

  const CtaTiles tiles = cta_tiles<BC>(a, q0, BR);
  if (tiles.begin >= tiles.end) return;
  const int tile_begin = tiles.begin, tile_end = tiles.end;
  const bool partial = tiles.partial;

  // Tile jt's K and V live in stage (jt - tile_begin) % STAGES.
  auto k_stage = [&](int jt) { return sKV + static_cast<uint32_t>((jt - tile_begin) % STAGES) * 2 * Tile::kKvBytes; };
  auto load_kv = [&](int jt) {
    load_panels<BC, D, THREADS>(k_stage(jt), kg, a.k_stride[2], jt * BC, a.kv_len);
    load_panels<BC, D, THREADS>(k_stage(jt) + Tile::kKvBytes, vg, a.v_stride[2], jt * BC, a.kv_len);
  };
  load_panels<BR, D, THREADS>(sQ, qg, a.q_stride[2], q0, a.q_len);
  load_kv(tile_begin);
  cp_async_commit();

  float o[D / 2];  // O accumulators: o[4 j + e] is row g + 8 (e / 2), column 8 j + 2 t4 + e % 2
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g, g + 8; max in log2 units
  float corr[2];
  const uint32_t q_rows = sQ + static_cast<uint32_t>(wg * 64 * 128);  // this warpgroup's rows in panel 0
  uint32_t p[BC / 16][4];                                             // P of the tile before the one in S

  // Software pipeline (FlashAttention-3's intra-warpgroup overlap): while the tensor cores compute tile jt's
  // S and tile jt - 1's P V, the warpgroup runs tile jt's softmax. Tile jt + 1 loads meanwhile. The first tile,
  // which has no P V before it, is its own instance of the step, so that every commit below closes a group of
  // real wgmma: the wait for S must leave exactly the P V group in flight, and a commit after a wgmma issued
  // only sometimes costs ptxas a placeholder wgmma on every tile.
  auto step = [&]<bool kFirst>(int jt) {
    cp_async_wait<0>();   // tile jt (the only group in flight)
    fence_proxy_async();  // this thread's copies, visible to wgmma once the barrier below has passed
    __syncthreads();      // ... and every warpgroup is past tile jt - 2's P V: its stage is free
    if (jt + 1 < tile_end) load_kv(jt + 1);
    cp_async_commit();

    float s[BC / 2];
    wgmma_fence();
    issue_qk<T, D, BR, BC>(s, q_rows, k_stage(jt));
    wgmma_commit();
    if constexpr (kFirst) {
      wgmma_wait<0>();  // S
    } else {
      issue_pv<T, D, BC>(o, p, k_stage(jt - 1) + Tile::kKvBytes);
      wgmma_commit();
      wgmma_wait<1>();  // S (P V may still run: it was committed last)
    }
    wgmma_fence_operands(s);
    mask_tile<BC>(s, a, jt * BC, q0 + warp_row0, g, t4);
    softmax_tile<BC>(s, a.scale_log2, row_max, row_sum, corr);
    if constexpr (!kFirst) {
      wgmma_wait<0>();
      wgmma_fence_operands(o);
    }
    rescale<D>(o, corr);
    pack_p<T, BC>(s, p);
  };
  step.template operator()<true>(tile_begin);
  for (int jt = tile_begin + 1; jt < tile_end; ++jt) step.template operator()<false>(jt);
  wgmma_fence();
  issue_pv<T, D, BC>(o, p, k_stage(tile_end - 1) + Tile::kKvBytes);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(o);

  if (partial) {  // this split's rows for flash_combine_kernel: unnormalized sums and (max, sum)
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

template <typename T, int D, int BC, int NWG, int CTAS>
void launch(FwdArgs& a, int64_t batch, cudaStream_t stream, int device) {
  using Tile = Sm90Tile<D, BC, NWG>;
  static_assert(CTAS * Tile::kSmemBytes <= 227 * 1024, "CTAS tiles fit an sm_90 SM's shared memory");
  constexpr auto kernel = flash_forward_sm90_kernel<T, D, BC, NWG, CTAS>;
  raise_smem_limit<kernel>(Tile::kSmemBytes, device);
  launch_split<T, D, Tile::kRows, BC>(kernel, Tile::kThreads, Tile::kSmemBytes, CTAS, a, batch, stream, device);
}

}  // namespace

void launch_sm90(FwdArgs& a, int64_t batch, int head_dim, bool bf16, cudaStream_t stream, int device) {
  // Tiles: the header comment (D 64: 64-key tiles, two CTAs an SM; D 128: 128-key tiles, one CTA an SM).
  if (head_dim == 64) {
    if (bf16)
      launch<__nv_bfloat16, 64, 64, 2, 2>(a, batch, stream, device);
    else
      launch<__half, 64, 64, 2, 2>(a, batch, stream, device);
  } else {
    if (bf16)
      launch<__nv_bfloat16, 128, 128, 2, 1>(a, batch, stream, device);
    else
      launch<__half, 128, 128, 2, 1>(a, batch, stream, device);
  }
}

}  // namespace flash_fwd

bool flash_forward_uses_wgmma(int device) { return flash_wgmma() && sm90a_kernels(device); }

}  // namespace microllm::cuda_kernels::attention
