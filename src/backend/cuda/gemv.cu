// The decode GEMV: out [m, n] = x [m, k] @ w [n, k]^T (+ bias) for m <= 8 rows, bf16/f16, f32 accumulation.
//
// Why: at decode a linear layer reads each weight once and does 2m flops per weight, so its time is the
// weight bytes over DRAM bandwidth. cuBLASLt's choices for these shapes leave most of the bandwidth unused
// (Nsight Compute, each kernel alone with caches flushed, Qwen2.5-0.5B batch 1 on the H200): qkv [1152, 896]
// 5.5 us, o [896, 896] 5.8 us, gate_up [9728, 896] 8.0 us (76 CTAs on 132 SMs: 17.4 MB at 2.2 TB/s), down
// [896, 4864] 6.4 us + a split-K reduce kernel 3.1 us: ~29 us a layer against a ~8.6 us bandwidth floor.
//
// An earlier GEMV (a warp per output column, each 16-byte weight load followed at once by its x loads and
// FMAs) looked fast with the weights in L2 but made the model slower (tg128 B1 573 vs 632 tok/s, B8 2,519
// vs 4,842): with DRAM behind it, each lane had about one load in flight; o and down (n = 896) ran 28
// warps per SM-wave with long k loops; and at m = 8 every weight element cost 8 x loads, 8 conversions and
// 8 FMAs, which is more issue slots than the SM has for DRAM-rate weights. This kernel:
//
// 1. Streams: per step each lane first issues kLoadsInFlight (8) 16-byte weight loads
//    (ld.global.nc.L1::no_allocate: read once, kept out of L1; L2::256B prefetch), only then consumes them:
//    8 x 512 B per warp in flight.
// 2. Multiplies on the tensor cores: one warp owns a group of 8 weight rows and computes the 16x8 tile
//    D = A B of mma.m16n8k16 with A = x (rows: the m <= 8 batch rows, rows 8..15 zero) and B = w^T (columns:
//    the 8 weight rows). The order of k inside a dot product is free, so lane (g, t) = (lane / 4, lane % 4)
//    loads 8 consecutive elements of weight row g and the same 8 elements of x row g, at k = 32c + 8t of
//    chunk c: registers 0-1 of each become the k-pairs (2t, 2t+8) of one mma, registers 2-3 of a second.
//    No conversions, no per-row FMA loops: two mma per 16-byte weight load whatever m is, and one 16-byte
//    x load (an L1 hit: every warp reads the same x) per weight load.
// 3. Fills the GPU: the warps of a CTA split k (split = 1..16 warps per row group, partial tiles summed
//    in shared memory in slice order: deterministic). The host picks split from n, k and the SM count
//    (the launch shape depends only on shapes, so graphs replay it): the smallest power of two that gives
//    16 warps per SM, but no more slices than k has steps of 8 chunks.
// 4. Rounds once: out = round(acc + bias) in f32, like cuBLASLt's bias epilogue.
// 5. Launches chained (common.cuh) in decode graphs: the first batch of weights streams in before the kernel
//    waits for the one before it.
//
// Where it runs: weights up to kMaxGemvBytes. Measured on the H200 (cuda_ops_bench --filter decode_linear,
// weights from DRAM, GEMV vs cuBLASLt): qkv and o of both models 1.19-1.61x, Qwen2.5-0.5B down (8.7 MB)
// 1.17-1.22x, but gate_up 17.4 MB 0.77-0.82x, 55 MB 0.59-0.65x, R1-1.5B down (27.5 MB) 0.89-1.02x: past
// ~16 MB cuBLASLt's tiles stream faster (about 2.5 TB/s against 2.1), and the head (272 MB) stays there too.
//
// MICROLLM_GEMV=0 (decode_gemv()) sends these products back to cuBLASLt, to A/B the two in one run.
#include "gemv.h"

#include <climits>

#include "attention_mma.cuh"
#include "common.cuh"
#include "microllm/backend/backend.h"
#include "rows.cuh"

namespace microllm::cuda_kernels {
namespace {

constexpr int kGemvMaxRows = 8;    // x rows: the 8 live rows of the mma's A (m16, rows 8..15 stay zero)
constexpr int kGroupRows = 8;      // weight rows per warp: the mma's n
constexpr int kChunk = 32;         // k per 16-byte load of every lane: 4 lanes x 8 elements per weight row
constexpr int kLoadsInFlight = 8;  // 16-byte weight loads each lane issues before it consumes any
constexpr int kMaxSplit = 16;      // warps per row group
constexpr int kMaxThreads = 32 * kMaxSplit;
constexpr int kWarpsTarget = 16;   // warps per SM the split aims for: enough 4 KB load batches in flight
constexpr int64_t kMaxGemvBytes = 16 << 20;  // larger weights go to cuBLASLt (measured: the header comment)

// A weight load: read once, so no L1 line; the 256-byte L2 prefetch brings the lane's next chunks along.
__device__ __forceinline__ uint4 load_streamed(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Grid: one CTA per blockDim / 32 / split row groups. Warp w works on row group w / split, k slice w % split
// (chunks [slice * chunks_per_warp, +chunks_per_warp) of ceil(k / 32)).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    decode_gemv_kernel(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, int64_t w_stride,
                       const T* __restrict__ bias, int64_t bias_stride, T* __restrict__ out, int m, int n, int k,
                       int split, int chunks_per_warp) {
  __shared__ float partial[kMaxThreads / 32][kGemvMaxRows * kGroupRows];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int groups_per_cta = static_cast<int>(blockDim.x) / 32 / split;
  const int64_t group0 = static_cast<int64_t>(blockIdx.x) * groups_per_cta;
  const int64_t row0 = (group0 + warp / split) * kGroupRows;
  const int chunks = (k + kChunk - 1) / kChunk;
  const int c_begin = (warp % split) * chunks_per_warp;
  const int c_end = min(chunks, c_begin + chunks_per_warp);

  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Rows past n (the last group) read row n - 1 again (L2 hits) and are never stored.
  const T* w_lane = w + (row0 + g < n ? row0 + g : n - 1) * w_stride + t * 8;
  uint4 wv[kLoadsInFlight];
  auto load_weights = [&](int c0) {
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; ++j) {
      const int c = c0 + j;
      // k % 8 == 0, so a lane's 8 elements lie wholly inside or wholly past k.
      wv[j] = (c < c_end && c * kChunk + t * 8 < k) ? load_streamed(w_lane + c * kChunk) : make_uint4(0, 0, 0, 0);
    }
  };
  // The weights are no kernel's output: the first batch streams in while the kernel before (chained
  // launch, common.cuh) still finishes; x, the bias and out wait for it.
  if (row0 < n) load_weights(c_begin);
  wait_for_prior_grids();
  chain_next_grids();
  if (row0 < n) {  // warp-uniform: the last CTA may hold groups past n
    const T* x_lane = x + (g < m ? g : 0) * x_stride + t * 8;
    const bool x_live = g < m;
    for (int c0 = c_begin; c0 < c_end; c0 += kLoadsInFlight) {
      if (c0 != c_begin) load_weights(c0);
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) {
        const int c = c0 + j;
        if (c >= c_end) break;  // warp-uniform, as mma.sync needs
        const uint4 xv = (x_live && c * kChunk + t * 8 < k) ? *reinterpret_cast<const uint4*>(x_lane + c * kChunk)
                                                             : make_uint4(0, 0, 0, 0);
        // A rows g (x row g) and g + 8 (zero); k pairs (2t, 2t+8) <- elements (8t, 8t+2) then (8t+4, 8t+6).
        const uint32_t a_lo[4] = {xv.x, 0u, xv.y, 0u}, a_hi[4] = {xv.z, 0u, xv.w, 0u};
        attn::mma_16816<T>(d, a_lo, wv[j].x, wv[j].y);
        attn::mma_16816<T>(d, a_hi, wv[j].z, wv[j].w);
      }
    }
  }
  // d[0], d[1] = (x row g, weight row 2t / 2t + 1 of the group); d[2], d[3] belong to A's zero rows.
  partial[warp][g * kGroupRows + 2 * t] = d[0];
  partial[warp][g * kGroupRows + 2 * t + 1] = d[1];
  __syncthreads();
  constexpr int kTile = kGemvMaxRows * kGroupRows;
  for (int e = static_cast<int>(threadIdx.x); e < groups_per_cta * kTile; e += static_cast<int>(blockDim.x)) {
    const int group = e / kTile, b = e % kTile / kGroupRows, r = e % kGroupRows;
    const int64_t row = (group0 + group) * kGroupRows + r;
    if (b >= m || row >= n) continue;
    float acc = 0.0f;
    for (int s = 0; s < split; ++s) acc += partial[group * split + s][b * kGroupRows + r];  // fixed order
    if (bias) acc += to_acc(bias[row * bias_stride]);
    out[b * static_cast<int64_t>(n) + row] = from_acc<T>(acc);
  }
}

struct GemvLaunch {
  int split, threads, chunks_per_warp;
  unsigned blocks;
};

// The launch shape from n, k and the SM count only (see the header comment, point 3).
GemvLaunch plan_launch(int64_t n, int64_t k, int sms) {
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows, chunks = (k + kChunk - 1) / kChunk;
  const int64_t steps = (chunks + kLoadsInFlight - 1) / kLoadsInFlight;  // load batches of one unsplit warp
  int split = 1;
  while (split < kMaxSplit && split < steps && groups * split < static_cast<int64_t>(sms) * kWarpsTarget) split *= 2;
  GemvLaunch l{};
  l.split = split;
  // At least 4 warps a CTA; one row group from split 4 up, so that few row groups still spread over many SMs.
  l.threads = 32 * std::max(split, 4);
  l.chunks_per_warp = static_cast<int>((chunks + split - 1) / split);
  const int64_t groups_per_cta = l.threads / 32 / split;
  l.blocks = static_cast<unsigned>((groups + groups_per_cta - 1) / groups_per_cta);
  return l;
}

}  // namespace

bool try_decode_gemv(const Tensor& x, const Tensor& w, const void* bias, int64_t bias_stride, const Tensor& out,
                     cudaStream_t stream) {
  const DType dtype = out.dtype();
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  if (x.dim() != 2 || w.dim() != 2 || out.dim() != 2 || x.dtype() != dtype || w.dtype() != dtype) return false;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  if (m < 1 || m > kGemvMaxRows || k < 1 || k % 8 != 0 || w.size(1) != k || n < 1) return false;
  if (n * k * static_cast<int64_t>(w.element_size()) > kMaxGemvBytes) return false;
  if (out.size(0) != m || out.size(1) != n || !out.is_contiguous() || n >= INT_MAX || k >= INT_MAX) return false;
  // 16-byte loads: unit inner strides, aligned base pointers, and row strides of whole 16-byte packs where a
  // second row is read.
  if (x.stride(1) != 1 || w.stride(1) != 1 || !rows::aligned16(x.data_ptr()) || !rows::aligned16(w.data_ptr())) {
    return false;
  }
  if ((m > 1 && x.stride(0) % 8 != 0) || (n > 1 && w.stride(0) % 8 != 0)) return false;
  if (!decode_gemv()) return false;

  const GemvLaunch l = plan_launch(n, k, multiprocessor_count(out.device().index));
  auto launch = [&]<typename T>() {
    launch_chained(decode_gemv_kernel<T>, l.blocks, l.threads, 0, stream, out.device().index,
                   static_cast<const T*>(x.data_ptr()), x.stride(0), static_cast<const T*>(w.data_ptr()), w.stride(0),
                   static_cast<const T*>(bias), bias_stride, static_cast<T*>(out.data_ptr()), static_cast<int>(m),
                   static_cast<int>(n), static_cast<int>(k), l.split, l.chunks_per_warp);
  };
  if (dtype == DType::bf16) launch.template operator()<__nv_bfloat16>();
  else launch.template operator()<__half>();
  return true;
}

}  // namespace microllm::cuda_kernels
