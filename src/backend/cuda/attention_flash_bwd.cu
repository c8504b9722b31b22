// Flash attention backward (FlashAttention-2 algorithm) for bf16/f16, head dim 64, 128 and 256.
//
// 1. prep kernel: delta_i = rowsum(dO_i * O_i) in f32 (one warp per row; the CPU's rowsum(P * dP) is the
//    same in exact arithmetic) and zeroes the f32 dQ accumulator row.
// 2. main kernel: one CTA per (batch, kv head, split of the group's query heads, block of BC = 64 keys);
//    K and V of the block stay in shared memory, dK and dV accumulate in registers over the query heads
//    of the split and the query blocks (BR = 64 rows) that see the keys, so GQA's sum over a group
//    happens inside the CTA. Per query block, with Q and dO double-buffered by cp.async:
//      S = Q K^T, dP = dO V^T           [64 x 64] (warp w: query m tile w % 4, keys 32 * (w / 4) ..+32)
//      P = exp2(S * scale log2 e - lse log2 e), dS = P * (dP - delta)   (masked entries exactly 0)
//      P, dS -> shared memory (bf16/f16, swizzled), then
//      dV += P^T dO, dK += dS^T Q      [64 x D] (warp w: key m tile w % 4, dims D/2 * (w / 4) ..+D/2;
//                                       A operands by ldmatrix.trans from P, dS: the transposes are free)
//      dQ += dS K                      [64 x D] (warp w: query m tile w % 4, dims half w / 4): the
//                                       key block's part of dQ (a separate dQ pass would recompute S and
//                                       dP again). Deterministic (the default, deterministic_algorithms()),
//                                       it is stored to its own slice of an f32 buffer [key blocks, rows, D];
//                                       otherwise added to one f32 accumulator with float2 atomics, whose
//                                       order of adds varies between runs.
//    The scale is applied once at the end (dK here, dQ in the cast kernel).
// 3. dQ kernel: dQ = scale * (sum of the key blocks' parts, in key order, only those the row sees) or
//    scale * accumulator, in q's dtype. When the group is split across CTAs (small batch: keeps >= 2 CTAs
//    per SM busy), each split writes f32 partial dK/dV and a reduce kernel sums the splits and casts; with
//    one split the main kernel writes dK/dV directly.
//
// Shared memory (elements of 2 bytes): K, V [64][D]; Q, dO [2][64][D]; P, dS [64][64]:
// D 64: 56 KiB, D 128: 112 KiB (two CTAs per SM), D 256: 208 KiB (one).
#include <algorithm>
#include <atomic>
#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"
#include "common.cuh"
#include "rows.cuh"
#include "microllm/backend/backend.h"

namespace microllm::cuda_kernels::attention {
namespace {

using namespace attn;

constexpr int kBR = 64;  // query rows per step
constexpr int kBC = 64;  // keys per CTA
constexpr int kWarps = 8;
constexpr int kThreadsBwd = kWarps * 32;
constexpr int kPChunks = kBC / 8;  // 16-byte chunks per row of P and dS

template <int D>
constexpr int bwd_smem_bytes() {
  return (2 * kBC * D + 4 * kBR * D + 2 * kBR * kBC) * 2;
}

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;    // [B, Hq, T]
  const float* delta;  // [B, Hq, T]
  float* dq_acc;       // [B, Hq, T, D] f32, zeroed by the prep kernel (atomic mode), or
  float* dq_part;      // [key blocks, B, Hq, T, D] f32, one slice per key block (deterministic mode)
  void* dk;            // [B, Hkv, S, D] in T, or f32 partials [n_split, B, Hkv, S, D]
  void* dv;
  int64_t q_stride[3], k_stride[3], v_stride[3], do_stride[3];  // batch, head, position; dim stride 1
  int batch, q_heads, kv_heads, group, n_split, q_len, kv_len, q_offset;
  int window;  // > 0: query i sees keys j > q_offset + i - window too
  bool causal, partial;
  float scale, scale_log2;
};

// CTAs an SM: two at D 64 and 128 (56 / 112 KiB of shared memory, <= 128 registers), one at D 256 (208 KiB; dK,
// dV and dQ's accumulators alone are 192 registers a thread).
template <int D>
constexpr int bwd_ctas_per_sm() {
  return D <= 128 ? 2 : 1;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreadsBwd, bwd_ctas_per_sm<D>()) flash_backward_kernel(const BwdArgs a) {
  constexpr int CH = D / 8;       // chunks per row of K, V, Q, dO
  constexpr int DH = D / 2;       // dims per warp in the [64 x D] products
  constexpr int NDT = DH / 8;     // n tiles of 8 dims per warp
  extern __shared__ __align__(128) unsigned char flash_bwd_smem[];
  T* sK = reinterpret_cast<T*>(flash_bwd_smem);  // [BC][D]
  T* sV = sK + kBC * D;                           // [BC][D]
  T* sQ = sV + kBC * D;                           // [2][BR][D]
  T* sdO = sQ + 2 * kBR * D;                      // [2][BR][D]
  T* sP = sdO + 2 * kBR * D;                      // [BR][BC]
  T* sdS = sP + kBR * kBC;                        // [BR][BC]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t4 = lane % 4;
  const int wm = warp & 3;   // m tile (16 rows) of this warp in every product
  const int wn = warp >> 2;  // key half (S, dP) or dim half (dV, dK, dQ)
  const int split = blockIdx.x % a.n_split;
  const int hk = (blockIdx.x / a.n_split) % a.kv_heads;
  const int b = blockIdx.x / (a.n_split * a.kv_heads);
  const int k0 = blockIdx.y * kBC;  // low key blocks (the most causal work) are scheduled first
  const int heads = a.group / a.n_split;
  const int h0 = hk * a.group + split * heads;

  // Query blocks that see any key of this block: rows i with q_offset + i >= k0 when causal, and under a window
  // rows i < (its last key) + window - q_offset.
  const int i_min = a.causal ? max(0, k0 - a.q_offset) : 0;
  const int i_end = a.window > 0 ? min(a.q_len, min(k0 + kBC, a.kv_len) - 1 + a.window - a.q_offset) : a.q_len;
  const int qb_begin = i_min / kBR;
  const int qb_end = i_end > 0 ? (i_end + kBR - 1) / kBR : 0;
  const int nq = max(0, qb_end - qb_begin);
  const int n_iters = heads * nq;

  float dk[NDT][4], dv[NDT][4];  // C layout: keys wm*16 + g (+8), dims wn*DH + dn*8 + 2t (+1)
#pragma unroll
  for (int dn = 0; dn < NDT; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dn][e] = dv[dn][e] = 0.f;

  const T* kg = static_cast<const T*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const T* vg = static_cast<const T*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];
  auto q_rows = [&](int it) {
    const int h = h0 + it / nq;
    return static_cast<const T*>(a.q) + b * a.q_stride[0] + h * a.q_stride[1];
  };
  auto do_rows = [&](int it) {
    const int h = h0 + it / nq;
    return static_cast<const T*>(a.dout) + b * a.do_stride[0] + h * a.do_stride[1];
  };
  auto q_first = [&](int it) { return (qb_begin + it % nq) * kBR; };

  // Per-lane byte offsets of the ldmatrix patterns at block (0, 0); see block_offset(). The warp's m tile
  // and dim half are folded in (adding wn * CH / 2 chunks carries into no bit of 2 * dp2).
  constexpr int kRowBytes = D * 2, kPRowBytes = kBC * 2;
  const uint32_t sK_u = smem_u32(sK), sV_u = smem_u32(sV), sQ_u = smem_u32(sQ), sdO_u = smem_u32(sdO);
  const uint32_t sP_u = smem_u32(sP), sdS_u = smem_u32(sdS);
  const uint32_t a_off = swizzle(wm * 16 + a_lane_row(lane), a_lane_chunk(lane), CH) * 16;       // Q, dO (A)
  const uint32_t nk_off = swizzle(wn * 32 + nk_lane_row(lane), nk_lane_chunk(lane), CH) * 16;    // K, V (B)
  const uint32_t pt_off = swizzle(nk_lane_row(lane), wm * 2 + nk_lane_chunk(lane), kPChunks) * 16;  // P^T, dS^T
  const uint32_t kn_off = swizzle(kn_lane_row(lane), wn * (CH / 2) + kn_lane_chunk(lane), CH) * 16;  // dO, Q, K (B)
  const uint32_t ds_off = swizzle(wm * 16 + a_lane_row(lane), a_lane_chunk(lane), kPChunks) * 16;  // dS (A)

  if (n_iters > 0) {
    copy_rows_swizzled<kBC, D, kThreadsBwd>(sK, kg, a.k_stride[2], k0, a.kv_len);
    copy_rows_swizzled<kBC, D, kThreadsBwd>(sV, vg, a.v_stride[2], k0, a.kv_len);
    copy_rows_swizzled<kBR, D, kThreadsBwd>(sQ, q_rows(0), a.q_stride[2], q_first(0), a.q_len);
    copy_rows_swizzled<kBR, D, kThreadsBwd>(sdO, do_rows(0), a.do_stride[2], q_first(0), a.q_len);
    cp_async_commit();
  }

  for (int it = 0; it < n_iters; ++it) {
    if (it + 1 < n_iters) {  // prefetch the next (head, query block) into the other stage
      const int stage = (it + 1) & 1;
      copy_rows_swizzled<kBR, D, kThreadsBwd>(sQ + stage * kBR * D, q_rows(it + 1), a.q_stride[2], q_first(it + 1),
                                              a.q_len);
      copy_rows_swizzled<kBR, D, kThreadsBwd>(sdO + stage * kBR * D, do_rows(it + 1), a.do_stride[2], q_first(it + 1),
                                              a.q_len);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t sQs = sQ_u + (it & 1) * kBR * kRowBytes;
    const uint32_t sdOs = sdO_u + (it & 1) * kBR * kRowBytes;
    const int h = h0 + it / nq;
    const int q0 = q_first(it);
    const int64_t row_base = (static_cast<int64_t>(b) * a.q_heads + h) * a.q_len;  // row index of (b, h, 0)

    // This lane's two query rows in S/dP: lse (log2 units) and delta; rows past T or without keys get P = 0.
    float lse2[2], dlt[2];
    bool row_ok[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = q0 + wm * 16 + g + hf * 8;
      const float l = row < a.q_len ? a.lse[row_base + row] : -INFINITY;
      row_ok[hf] = l != -INFINITY;
      lse2[hf] = row_ok[hf] ? l * 1.4426950408889634f : 0.f;
      dlt[hf] = row < a.q_len ? a.delta[row_base + row] : 0.f;
    }

    // ---- S = Q K^T and dP = dO V^T: 16 query rows x 32 keys per warp ----
    float s[4][4], dp[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], da[4];
      ldsm_x4(qa, sQs + block_offset(a_off, 0, kk, kRowBytes));
      ldsm_x4(da, sdOs + block_offset(a_off, 0, kk, kRowBytes));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t kb[4], vb[4];
        ldsm_x4(kb, sK_u + block_offset(nk_off, np * 16, kk, kRowBytes));
        ldsm_x4(vb, sV_u + block_offset(nk_off, np * 16, kk, kRowBytes));
        mma_16816<T>(s[2 * np], qa, kb[0], kb[1]);
        mma_16816<T>(s[2 * np + 1], qa, kb[2], kb[3]);
        mma_16816<T>(dp[2 * np], da, vb[0], vb[1]);
        mma_16816<T>(dp[2 * np + 1], da, vb[2], vb[3]);
      }
    }

    // ---- P and dS, written to shared memory as T ----
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1;
        const int row = q0 + wm * 16 + g + hf * 8;
        const int col = k0 + wn * 32 + nt * 8 + 2 * t4 + (e & 1);
        const bool visible = row_ok[hf] && col < a.kv_len && sees_key(a.causal, a.q_offset, a.window, row, col);
        const float p = visible ? exp2f(s[nt][e] * a.scale_log2 - lse2[hf]) : 0.f;
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - dlt[hf]);
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int off = swizzle(wm * 16 + g + hf * 8, wn * 4 + nt, kPChunks) * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(sP + off) = pack2<T>(s[nt][2 * hf], s[nt][2 * hf + 1]);
        *reinterpret_cast<uint32_t*>(sdS + off) = pack2<T>(dp[nt][2 * hf], dp[nt][2 * hf + 1]);
      }
    }
    __syncthreads();

    // ---- dV += P^T dO and dK += dS^T Q: 16 keys x D/2 dims per warp, k = the 64 query rows ----
#pragma unroll
    for (int kc = 0; kc < kBR / 16; ++kc) {
      uint32_t pa[4], sa[4];
      ldsm_x4_trans(pa, sP_u + block_offset(pt_off, kc * 16, 0, kPRowBytes));
      ldsm_x4_trans(sa, sdS_u + block_offset(pt_off, kc * 16, 0, kPRowBytes));
#pragma unroll
      for (int dp2 = 0; dp2 < NDT / 2; ++dp2) {
        uint32_t ob[4], qb[4];
        ldsm_x4_trans(ob, sdOs + block_offset(kn_off, kc * 16, dp2, kRowBytes));
        ldsm_x4_trans(qb, sQs + block_offset(kn_off, kc * 16, dp2, kRowBytes));
        mma_16816<T>(dv[2 * dp2], pa, ob[0], ob[1]);
        mma_16816<T>(dv[2 * dp2 + 1], pa, ob[2], ob[3]);
        mma_16816<T>(dk[2 * dp2], sa, qb[0], qb[1]);
        mma_16816<T>(dk[2 * dp2 + 1], sa, qb[2], qb[3]);
      }
    }

    // ---- dQ += dS K: 16 query rows x D/2 dims per warp, k = the 64 keys; f32 atomics ----
    {
      float dq[NDT][4];
#pragma unroll
      for (int dn = 0; dn < NDT; ++dn) dq[dn][0] = dq[dn][1] = dq[dn][2] = dq[dn][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < kBC / 16; ++kc) {
        uint32_t sa[4];
        ldsm_x4(sa, sdS_u + block_offset(ds_off, 0, kc, kPRowBytes));
#pragma unroll
        for (int dp2 = 0; dp2 < NDT / 2; ++dp2) {
          uint32_t kb[4];
          ldsm_x4_trans(kb, sK_u + block_offset(kn_off, kc * 16, dp2, kRowBytes));
          mma_16816<T>(dq[2 * dp2], sa, kb[0], kb[1]);
          mma_16816<T>(dq[2 * dp2 + 1], sa, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = q0 + wm * 16 + g + hf * 8;
        if (row >= a.q_len) continue;
        const int64_t at = (row_base + row) * D + wn * DH + 2 * t4;
        if (a.dq_part != nullptr) {
          float* dst = a.dq_part + static_cast<int64_t>(blockIdx.y) * a.batch * a.q_heads * a.q_len * D + at;
#pragma unroll
          for (int dn = 0; dn < NDT; ++dn) {
            *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(dq[dn][2 * hf], dq[dn][2 * hf + 1]);
          }
        } else {
          float* dst = a.dq_acc + at;
#pragma unroll
          for (int dn = 0; dn < NDT; ++dn) {
            atomicAdd(reinterpret_cast<float2*>(dst + dn * 8), make_float2(dq[dn][2 * hf], dq[dn][2 * hf + 1]));
          }
        }
      }
    }
    __syncthreads();  // P, dS and this stage of Q, dO are rewritten next iteration
  }

  // ---- dK (scaled) and dV of this block's keys; zeros for keys no query sees ----
  const int64_t kv_row0 = (static_cast<int64_t>(b) * a.kv_heads + hk) * a.kv_len;
  const int64_t part0 = a.partial ? static_cast<int64_t>(split) * a.batch * a.kv_heads * a.kv_len : 0;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = k0 + wm * 16 + g + hf * 8;
    if (key >= a.kv_len) continue;
    const int64_t off = (part0 + kv_row0 + key) * D + wn * DH + 2 * t4;
#pragma unroll
    for (int dn = 0; dn < NDT; ++dn) {
      const float k_lo = dk[dn][2 * hf] * a.scale, k_hi = dk[dn][2 * hf + 1] * a.scale;
      const float v_lo = dv[dn][2 * hf], v_hi = dv[dn][2 * hf + 1];
      if (a.partial) {
        *reinterpret_cast<float2*>(static_cast<float*>(a.dk) + off + dn * 8) = make_float2(k_lo, k_hi);
        *reinterpret_cast<float2*>(static_cast<float*>(a.dv) + off + dn * 8) = make_float2(v_lo, v_hi);
      } else {
        *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dk) + off + dn * 8) = pack2<T>(k_lo, k_hi);
        *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dv) + off + dn * 8) = pack2<T>(v_lo, v_hi);
      }
    }
  }
}

// delta[r] = sum_d dO[r, d] * O[r, d] (f32) and dq_acc[r, :] = 0 when there is one; one warp per row (b, h, i).
template <typename T>
__global__ void __launch_bounds__(256)
    prep_kernel(const T* __restrict__ out, int64_t o_s0, int64_t o_s1, int64_t o_s2, int64_t o_s3,
                const T* __restrict__ dout, int64_t d_s0, int64_t d_s1, int64_t d_s2, int64_t d_s3, int64_t rows,
                int q_heads, int q_len, int D, float* __restrict__ delta, float* __restrict__ dq_acc) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const int64_t i = r % q_len, h = (r / q_len) % q_heads, b = r / (static_cast<int64_t>(q_len) * q_heads);
    const T* o = out + b * o_s0 + h * o_s1 + i * o_s2;
    const T* d = dout + b * d_s0 + h * d_s1 + i * d_s2;
    float sum = 0.f;
    for (int c = lane; c < D; c += 32) {
      sum += to_acc(o[c * o_s3]) * to_acc(d[c * d_s3]);
      if (dq_acc != nullptr) dq_acc[r * D + c] = 0.f;
    }
    sum = warp_sum(sum);
    if (lane == 0) delta[r] = sum;
  }
}

template <typename T>
__global__ void cast_dq_kernel(const float* __restrict__ acc, float scale, int64_t n, T* __restrict__ dq) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) { dq[i] = from_acc<T>(scale * acc[i]); }
}

// dq[r, d] = scale * sum over the key blocks row r sees (in order) of part[kb, r, d]. Causal, the row at
// position i sees key blocks up to (q_offset + i) / BC, and under a window from (q_offset + i - window + 1) / BC;
// the main kernel wrote those slices (and maybe others before the window, all zero for this row).
template <typename T>
__global__ void sum_dq_parts_kernel(const float* __restrict__ part, float scale, int64_t rows, int D, int q_len,
                                    int n_kb, bool causal, int q_offset, int window, T* __restrict__ dq) {
  const int64_t n = rows * D;
  MICROLLM_GRID_STRIDE_LOOP(e, n) {
    const int64_t r = e / D;
    const int i = static_cast<int>(r % q_len);
    const int seen = causal ? min(n_kb, (q_offset + i) / kBC + 1) : n_kb;
    const int first = window > 0 ? max(0, q_offset + i - window + 1) / kBC : 0;
    float sum = 0.f;
    for (int kb = first; kb < seen; ++kb) sum += part[kb * n + e];
    dq[e] = from_acc<T>(scale * sum);
  }
}

// dk[i] = sum over splits of part_k[s, i] (already scaled), likewise dv.
template <typename T>
__global__ void reduce_splits_kernel(const float* __restrict__ part_k, const float* __restrict__ part_v, int n_split,
                                     int64_t n, T* __restrict__ dk, T* __restrict__ dv) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    float sk = 0.f, sv = 0.f;
    for (int s = 0; s < n_split; ++s) {
      sk += part_k[s * n + i];
      sv += part_v[s * n + i];
    }
    dk[i] = from_acc<T>(sk);
    dv[i] = from_acc<T>(sv);
  }
}


// The smallest divisor of `group` that gives at least `target` CTAs (or the whole group).
int choose_split(int64_t base_ctas, int64_t group, int64_t target) {
  for (int64_t d = 1; d < group; ++d) {
    if (group % d == 0 && base_ctas * d >= target) return static_cast<int>(d);
  }
  return static_cast<int>(group);
}

template <typename T, int D>
void launch_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const Tensor& dout, const Tensor& grad_q, const Tensor& grad_k,
                     const Tensor& grad_v, cudaStream_t stream, int device) {
  const Device dev = q.device();
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  const int64_t n_kb = (p.kv_len + kBC - 1) / kBC;
  const bool deterministic = deterministic_algorithms();
  const Tensor delta = Tensor::empty({rows}, DType::f32, dev);
  const Tensor dq_acc = deterministic ? Tensor() : Tensor::empty({rows * D}, DType::f32, dev);
  const Tensor dq_part = deterministic ? Tensor::empty({n_kb * rows * D}, DType::f32, dev) : Tensor();
  {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, int64_t{1} << 20));
    prep_kernel<T><<<blocks, 256, 0, stream>>>(
        static_cast<const T*>(out.data_ptr()), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        static_cast<const T*>(dout.data_ptr()), dout.stride(0), dout.stride(1), dout.stride(2), dout.stride(3),
        rows, static_cast<int>(p.q_heads), static_cast<int>(p.q_len), D, delta.data<float>(),
        deterministic ? nullptr : dq_acc.data<float>());
    MICROLLM_CUDA_CHECK_LAUNCH();
  }

  const int n_split =
      choose_split(p.batch * p.kv_heads * n_kb, p.group, bwd_ctas_per_sm<D>() * multiprocessor_count(device));
  const int64_t kv_elems = p.batch * p.kv_heads * p.kv_len * D;
  Tensor part_k, part_v;
  BwdArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.dout = dout.data_ptr();
  a.lse = lse.data<float>();
  a.delta = delta.data<float>();
  a.dq_acc = deterministic ? nullptr : dq_acc.data<float>();
  a.dq_part = deterministic ? dq_part.data<float>() : nullptr;
  if (n_split > 1) {
    part_k = Tensor::empty({n_split * kv_elems}, DType::f32, dev);
    part_v = Tensor::empty({n_split * kv_elems}, DType::f32, dev);
    a.dk = part_k.data_ptr();
    a.dv = part_v.data_ptr();
  } else {
    a.dk = grad_k.data_ptr();
    a.dv = grad_v.data_ptr();
  }
  rows::strides3(q, a.q_stride);
  rows::strides3(k, a.k_stride);
  rows::strides3(v, a.v_stride);
  rows::strides3(dout, a.do_stride);
  a.batch = static_cast<int>(p.batch);
  a.q_heads = static_cast<int>(p.q_heads);
  a.kv_heads = static_cast<int>(p.kv_heads);
  a.group = static_cast<int>(p.group);
  a.n_split = n_split;
  a.q_len = static_cast<int>(p.q_len);
  a.kv_len = static_cast<int>(p.kv_len);
  a.q_offset = p.causal ? static_cast<int>(p.q_offset) : 0;
  a.causal = p.causal;
  a.window = static_cast<int>(p.window);  // < q_offset + T <= S (make_problem): an int
  a.partial = n_split > 1;
  a.scale = static_cast<float>(p.scale);
  a.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);

  constexpr auto kernel = flash_backward_kernel<T, D>;
  constexpr int smem = bwd_smem_bytes<D>();
  raise_smem_limit<kernel>(smem, device);
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads * n_split), static_cast<unsigned>(n_kb));
  kernel<<<grid, kThreadsBwd, smem, stream>>>(a);
  MICROLLM_CUDA_CHECK_LAUNCH();

  const int64_t q_elems = rows * D;
  if (deterministic) {
    sum_dq_parts_kernel<T><<<grid_for(q_elems), kThreads, 0, stream>>>(
        dq_part.data<float>(), a.scale, rows, D, a.q_len, static_cast<int>(n_kb), a.causal, a.q_offset,
        a.window, static_cast<T*>(grad_q.data_ptr()));
  } else {
    cast_dq_kernel<T><<<grid_for(q_elems), kThreads, 0, stream>>>(dq_acc.data<float>(), a.scale, q_elems,
                                                                    static_cast<T*>(grad_q.data_ptr()));
  }
  MICROLLM_CUDA_CHECK_LAUNCH();
  if (n_split > 1) {
    reduce_splits_kernel<T><<<grid_for(kv_elems), kThreads, 0, stream>>>(
        part_k.data<float>(), part_v.data<float>(), n_split, kv_elems, static_cast<T*>(grad_k.data_ptr()),
        static_cast<T*>(grad_v.data_ptr()));
    MICROLLM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void flash_backward(const Problem& p, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out,
                    const Tensor& lse_in, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                    const Tensor& grad_v, cudaStream_t stream, int device) {
  const Tensor q = vector_ready(q_in), k = vector_ready(k_in), v = vector_ready(v_in);
  const Tensor dout = vector_ready(grad_out);
  const Tensor lse = lse_in.contiguous();
  const bool bf16 = q.dtype() == DType::bf16;
  if (p.head_dim == 64) {
    if (bf16) launch_backward<__nv_bfloat16, 64>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
    else launch_backward<__half, 64>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
  } else if (p.head_dim == 128) {
    if (bf16) launch_backward<__nv_bfloat16, 128>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
    else launch_backward<__half, 128>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
  } else {
    if (bf16) launch_backward<__nv_bfloat16, 256>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
    else launch_backward<__half, 256>(p, q, k, v, out, lse, dout, grad_q, grad_k, grad_v, stream, device);
  }
}

}  // namespace microllm::cuda_kernels::attention
