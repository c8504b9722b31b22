// Flash attention forward (FlashAttention-2) for bf16/f16, head dim 64, 96 (as 128), 128 and 256, on tensor cores.
// This is the portable kernel (mma.sync, any sm_80+ GPU; what a HIP port keeps) and the one the Hopper kernel
// (attention_flash_fwd_sm90.cu, wgmma) is tested against; flash_forward runs the Hopper one on an H100/H200.
// Shared by both: the arguments, the split-keys plan, the combine kernel (attention_flash_fwd.cuh).
//
// One CTA per (batch, query head, block of BR = 128 query rows); 8 warps, each owning 16 query rows (one
// m16 tile, MT = 1): faster on Hopper than FlashAttention-2's sm80 shape of 4 warps of two m tiles, which reads
// shared memory half as often per mma (docs/perf/kernels.md#flash-forward).
// K and V tiles of BC keys stream through shared memory, double-buffered with cp.async (the load of tile
// j + 1 is in flight while tile j is computed). Per tile and warp:
//   S [16 x BC] = Q K^T     (mma.m16n8k16; Q and K fragments by ldmatrix from swizzled shared memory)
//   online softmax in registers, in log2 units (s * scale * log2 e, exp2f), running max m and sum l
//   O [16 x D] += P V       (P re-packed from the S accumulators into A fragments: no shared memory;
//                            V fragments by ldmatrix.trans)
// Causal: the CTA stops at its last row's diagonal, and under a sliding window starts at the tile of its first
// row's first key; only tiles that cross the diagonal, the window's edge or the end of the keys are masked. [T, S] is never materialized. Output goes through shared memory for 16-byte stores; lse
// (natural log) is written for the backward.
//
// Split keys. A causal block's work grows with its position, so when B x Hq x query blocks is small
// (a batch-1 prefill: Qwen2.5-0.5B T 2048 is 224 CTAs for 264 slots of an H200) the last block, which
// reads every key, sets the kernel's time while most SMs idle. Then the host picks a chunk of key tiles near
// one slot's share of all the work (split_plan; half or 3/4 of it was slower) and a block longer than that runs
// as several CTAs (grid.z), split s taking the chunk that ends s chunks before the block's last tile (split 0
// holds the diagonal; the first key tiles are the shortest, last-launched piece). Each such CTA writes its rows'
// unnormalized f32 sums and (max, sum); flash_combine_kernel, a warp per row, merges them as the decode path's
// combine does. Blocks no longer than a chunk write their output directly.
//
// Tiles: BC = 64 keys for every head dim; launch bounds (256, 2) at D 64 and 128, i.e. two CTAs (16 warps) an SM
// at <= 128 registers (D 128 spills 78 bytes), (256, 1) at D 256 (Gemma 3: 128 O accumulators a thread; 255
// registers, 134 bytes spilled). Shared memory: Q [BR][D], K [2][BC][D], V [2][BC][D] (bf16/f16, 16-byte chunks
// XOR-swizzled): 48 KiB (D 64), 96 KiB (D 128), 192 KiB (D 256). D 96 (Phi-3) runs on the tiles of D 128.
#include <algorithm>
#include <cmath>

#include "attention_flash_fwd.cuh"
#include "attention_kernels.h"
#include "rows.cuh"

namespace microllm::cuda_kernels::attention {
namespace {

using namespace attn;
using namespace flash_fwd;

template <int D, int BC, int NW, int MT>
struct FwdTile {
  static constexpr int kThreads = NW * 32;
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int kRows = NW * kWarpRows;  // BR
  static constexpr int kChunks = D / 8;         // 16-byte chunks per row
  static constexpr int kSmemBytes = (kRows * D + 4 * BC * D) * 2;
  // CTAs an SM holds: the launch bounds make the compiler fit the registers, and the tiles' shared memory
  // (48 / 96 KiB at D 64 / 128) fits twice; at D 256 (192 KiB, 128 O accumulators a thread) once. The split plan
  // counts its slots with it.
  static constexpr int kCtasPerSm = D <= 128 ? 2 : 1;
  static_assert(kCtasPerSm * kSmemBytes <= 227 * 1024, "kCtasPerSm tiles fit an sm_90 SM's shared memory");
  static_assert(D % 64 == 0 && BC % 16 == 0, "rows of >= 8 chunks for the swizzle; n tiles in pairs");
};

// D is the tile's head dim, DV <= D the tensors' (Phi-3's 96 on tiles of 128: Q, K and V zero-filled past DV, so S
// is exact and O's extra columns are 0, never stored).
template <typename T, int D, int BC, int NW, int MT, int DV>
__global__ void __launch_bounds__(NW * 32, (FwdTile<D, BC, NW, MT>::kCtasPerSm))
    flash_forward_kernel(const FwdArgs a) {
  wait_for_prior_grids();  // launched chained in a captured prefill: q, k, v come from the kernel before
  using Tile = FwdTile<D, BC, NW, MT>;
  constexpr int BR = Tile::kRows, CH = Tile::kChunks, THREADS = Tile::kThreads;
  extern __shared__ __align__(128) unsigned char flash_fwd_smem[];
  T* sQ = reinterpret_cast<T*>(flash_fwd_smem);  // [BR][D]
  T* sK = sQ + BR * D;                            // [2][BC][D]
  T* sV = sK + 2 * BC * D;                        // [2][BC][D]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t4 = lane % 4;  // PTX groupID, threadID_in_group
  const int b = blockIdx.x / a.q_heads, h = blockIdx.x % a.q_heads, hk = h / a.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;  // the longest (causal) blocks are scheduled first
  const int warp_row0 = warp * Tile::kWarpRows;     // this warp's first row in the block

  const T* qg = static_cast<const T*>(a.q) + b * a.q_stride[0] + h * a.q_stride[1];
  const T* kg = static_cast<const T*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const T* vg = static_cast<const T*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];

  const CtaTiles tiles = cta_tiles<BC>(a, q0, BR);
  if (tiles.begin >= tiles.end) return;
  const int tile_begin = tiles.begin, tile_end = tiles.end;
  const bool partial = tiles.partial;

  // Per-lane byte offsets of the three ldmatrix patterns at block (0, 0); see block_offset().
  constexpr int kRowBytes = D * 2;
  const uint32_t sQ_u = smem_u32(sQ), sK_u = smem_u32(sK), sV_u = smem_u32(sV);
  const uint32_t q_lane = swizzle(warp_row0 + a_lane_row(lane), a_lane_chunk(lane), CH) * 16;
  const uint32_t k_lane = swizzle(nk_lane_row(lane), nk_lane_chunk(lane), CH) * 16;
  const uint32_t v_lane = swizzle(kn_lane_row(lane), kn_lane_chunk(lane), CH) * 16;

  copy_rows_swizzled<BR, D, THREADS, DV>(sQ, qg, a.q_stride[2], q0, a.q_len);
  copy_rows_swizzled<BC, D, THREADS, DV>(sK, kg, a.k_stride[2], tile_begin * BC, a.kv_len);
  copy_rows_swizzled<BC, D, THREADS, DV>(sV, vg, a.v_stride[2], tile_begin * BC, a.kv_len);
  cp_async_commit();

  float o[MT][D / 8][4];                    // O accumulators, C layout: [m tile][d tile of 8][c0..c3]
  float row_max[MT][2], row_sum[MT][2];     // rows g and g + 8 of each m tile; max in log2 units
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) o[mt][dn][0] = o[mt][dn][1] = o[mt][dn][2] = o[mt][dn][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  for (int jt = tile_begin; jt < tile_end; ++jt) {
    const int stage_now = (jt - tile_begin) & 1;
    // Prefetch tile jt + 1 into the other stage (freed by the barrier that ended iteration jt - 1).
    if (jt + 1 < tile_end) {
      const int stage = stage_now ^ 1;
      copy_rows_swizzled<BC, D, THREADS, DV>(sK + stage * BC * D, kg, a.k_stride[2], (jt + 1) * BC, a.kv_len);
      copy_rows_swizzled<BC, D, THREADS, DV>(sV + stage * BC * D, vg, a.v_stride[2], (jt + 1) * BC, a.kv_len);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile jt
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t sKs = sK_u + stage_now * BC * kRowBytes;
    const uint32_t sVs = sV_u + stage_now * BC * kRowBytes;

    // ---- S = Q K^T: [MT m tiles][BC / 8 n tiles] ----
    float s[MT][BC / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm_x4(qa[mt], sQ_u + block_offset(q_lane, mt * 16, kk, kRowBytes));
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, sKs + block_offset(k_lane, np * 16, kk, kRowBytes));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // ---- scale to log2 units; mask keys past the end, the diagonal or the window (tiles that need it) ----
    const int key0 = jt * BC;
    const int row_lo = q0 + warp_row0;
    const bool need_mask = tile_needs_mask(a, key0, BC, row_lo, row_lo + Tile::kWarpRows - 1);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][nt][e] * a.scale_log2;
          if (need_mask) {
            const int row = q0 + warp_row0 + mt * 16 + g + (e >> 1) * 8;
            const int col = key0 + nt * 8 + 2 * t4 + (e & 1);
            if (!key_visible(a, row, col)) x = -INFINITY;
          }
          s[mt][nt][e] = x;
        }

    // ---- online softmax: rows g (c0, c1) and g + 8 (c2, c3); a row's 4 lanes share it by shuffles ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = row_max[mt][hf];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        mx = fmaxf(mx, MICROLLM_SHFL_XOR(mx, 1));
        mx = fmaxf(mx, MICROLLM_SHFL_XOR(mx, 2));
        // -inf while the row has seen no key: subtract 0 so exp2f(-inf - 0) = 0, never NaN.
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float corr = exp2f(row_max[mt][hf] - m_use);
        row_max[mt][hf] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
          const float p0 = exp2f(s[mt][nt][2 * hf] - m_use), p1 = exp2f(s[mt][nt][2 * hf + 1] - m_use);
          s[mt][nt][2 * hf] = p0;
          s[mt][nt][2 * hf + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;  // this lane's columns; summed over lanes at the end
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
          o[mt][dn][2 * hf] *= corr;
          o[mt][dn][2 * hf + 1] *= corr;
        }
      }

    // ---- O += P V: the C fragments of two adjacent n tiles of S are the A fragment of one k16 step ----
#pragma unroll
    for (int kc = 0; kc < BC / 16; ++kc) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kc][0], s[mt][2 * kc][1]);          // (g,     keys 2t..)
        pa[mt][1] = pack2<T>(s[mt][2 * kc][2], s[mt][2 * kc][3]);          // (g + 8, keys 2t..)
        pa[mt][2] = pack2<T>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);  // (g,     keys 2t + 8..)
        pa[mt][3] = pack2<T>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);  // (g + 8, keys 2t + 8..)
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, sVs + block_offset(v_lane, kc * 16, dp, kRowBytes));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before iteration jt + 1 refills it
  }

  if (partial) {  // this split's rows for flash_combine_kernel: unnormalized sums and (max, sum)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float l = quad_sum(row_sum[mt][hf]);
        const int row = q0 + warp_row0 + mt * 16 + g + hf * 8;
        if (row < a.q_len) {
          write_split_partial<D>(a, row, row_max[mt][hf], l, t4, [&](int j, int e) { return o[mt][j][2 * hf + e]; });
        }
      }
    return;
  }

  // ---- epilogue: O / l through this warp's own rows of sQ (no other warp reads them), lse ----
  T* out = out_row<T>(a, b, h, 0);
  float* lse = a.lse + (static_cast<int64_t>(b) * a.q_heads + h) * a.q_len;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = quad_sum(row_sum[mt][hf]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row_local = warp_row0 + mt * 16 + g + hf * 8;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(sQ + swizzle(row_local, dn, CH) * 8 + 2 * t4) =
            pack2<T>(o[mt][dn][2 * hf] * inv, o[mt][dn][2 * hf + 1] * inv);
      }
      const int row = q0 + row_local;
      if (t4 == 0 && row < a.q_len) lse[row] = row_lse(row_max[mt][hf], l);
    }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < Tile::kWarpRows * CH / 32; ++n) {
    const int c = n * 32 + lane;
    const int r = warp_row0 + c / CH, ch = c % CH;
    if (q0 + r < a.q_len && ch < DV / 8) {
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(q0 + r) * a.out_stride[2] + ch * 8) =
          *reinterpret_cast<const uint4*>(sQ + swizzle(r, ch, CH) * 8);
    }
  }
}

template <typename T, int D, int BC, int NW, int MT, int DV = D>
void launch_forward(FwdArgs& a, int64_t batch, cudaStream_t stream, int device) {
  using Tile = FwdTile<D, BC, NW, MT>;
  constexpr auto kernel = flash_forward_kernel<T, D, BC, NW, MT, DV>;
  raise_smem_limit<kernel>(Tile::kSmemBytes, device);
  launch_split<T, D, Tile::kRows, BC, DV>(kernel, Tile::kThreads, Tile::kSmemBytes, Tile::kCtasPerSm, a, batch, stream,
                                      device);
}


}  // namespace

bool flash_supported(const Problem& p, DType dtype, bool has_mask) {
  // int positions inside the kernels; grid.y is the query blocks (forward) or key blocks (backward).
  constexpr int64_t kMaxLen = int64_t{1} << 30;
  return (dtype == DType::bf16 || dtype == DType::f16) && !has_mask &&
         (p.head_dim == 64 || p.head_dim == 96 || p.head_dim == 128 || p.head_dim == 256) &&
         p.q_len > 0 && p.kv_len > 0 && p.q_len < kMaxLen && p.kv_len < kMaxLen && p.q_len / 128 < 65535 && p.kv_len / 64 < 65535 &&
         p.batch * p.q_heads < (int64_t{1} << 31);
}

bool flash_backward_supported(const Problem& p, DType dtype, bool has_mask) {
  return flash_supported(p, dtype, has_mask) && p.head_dim != 96;
}

void flash_forward(const Problem& p, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out,
                   const Tensor& lse, cudaStream_t stream, int device) {
  const Tensor q = vector_ready(q_in), k = vector_ready(k_in), v = vector_ready(v_in);
  FwdArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.out = out.data_ptr();
  a.lse = lse.data<float>();
  rows::strides3(q, a.q_stride);
  rows::strides3(k, a.k_stride);
  rows::strides3(v, a.v_stride);
  rows::strides3(out, a.out_stride);
  a.q_heads = static_cast<int>(p.q_heads);
  a.group = static_cast<int>(p.group);
  a.q_len = static_cast<int>(p.q_len);
  a.kv_len = static_cast<int>(p.kv_len);
  a.q_offset = p.causal ? static_cast<int>(p.q_offset) : 0;  // causal: q_offset + T <= S (checked by ops)
  a.causal = p.causal;
  a.window = static_cast<int>(p.window);  // < q_offset + T <= S (make_problem): an int
  a.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  const bool bf16 = q.dtype() == DType::bf16;
  // The Hopper kernel takes D 64 and 128 (it folds the scale into the max); the others run here.
  if (a.scale_log2 > 0 && (p.head_dim == 64 || p.head_dim == 128) && flash_forward_uses_wgmma(device)) {
    flash_fwd::launch_sm90(a, p.batch, static_cast<int>(p.head_dim), bf16, stream, device);
    return;
  }
  // Tiles: the header comment (8 warps of one m tile, 64-key tiles).
  if (p.head_dim == 64) {
    if (bf16) launch_forward<__nv_bfloat16, 64, 64, 8, 1>(a, p.batch, stream, device);
    else launch_forward<__half, 64, 64, 8, 1>(a, p.batch, stream, device);
  } else if (p.head_dim == 96) {  // on tiles of 128
    if (bf16) launch_forward<__nv_bfloat16, 128, 64, 8, 1, 96>(a, p.batch, stream, device);
    else launch_forward<__half, 128, 64, 8, 1, 96>(a, p.batch, stream, device);
  } else if (p.head_dim == 128) {
    if (bf16) launch_forward<__nv_bfloat16, 128, 64, 8, 1>(a, p.batch, stream, device);
    else launch_forward<__half, 128, 64, 8, 1>(a, p.batch, stream, device);
  } else {
    if (bf16) launch_forward<__nv_bfloat16, 256, 64, 8, 1>(a, p.batch, stream, device);
    else launch_forward<__half, 256, 64, 8, 1>(a, p.batch, stream, device);
  }
}

}  // namespace microllm::cuda_kernels::attention
