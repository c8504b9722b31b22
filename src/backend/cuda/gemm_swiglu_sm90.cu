// The MLP's input half as one Hopper GEMM (sm_90a): out [M, N] = silu(x @ w_gate^T) * (x @ w_up^T) with
// w = [w_gate; w_up] [2N, K], bf16/f16, f32 accumulation; SwiGLU in the epilogue, so the [M, 2N] product is never
// written and the separate swiglu kernel never reads it back.
//
// Why: at prefill size cuBLASLt writes the [M, 2N] product and the swiglu kernel streams it back at copy
// bandwidth, and cuBLASLt has no SiLU epilogue (cublasLt.h: ReLU, GELU, bias and their gradients), so the fusion
// needs a GEMM of our own (docs/perf/kernels.md#gemm_swiglu_sm90).
//
// The kernel is the standard Hopper design (CUTLASS's warp-specialized persistent kernels, FlashAttention-3):
//   - Persistent: one CTA per SM walks the tiles (tile t, t + grid, ...); a tile is 128 rows of x by 128 output
//     columns, i.e. 128 gate rows and the 128 matching up rows of w, so each output's gate and up accumulators
//     sit in the same thread. Tiles go row-block-fastest, so the CTAs working at once share their weight rows
//     (from DRAM once, then L2 hits) and x stays in L2.
//   - Warp 0, one thread: the producer. It issues the Tensor Memory Accelerator's copies (cp.async.bulk.tensor)
//     of 64-wide k slices of x and of the tile's gate and up rows into a 3-stage ring of shared memory, each stage
//     a "full" mbarrier the copies complete (by bytes) and an "empty" one the consumers release. TMA writes the
//     128-byte swizzle wgmma reads (attention_wgmma.cuh) and fills rows or columns past the tensor's end with
//     zeros, so any M, any N % 8 == 0 and any K % 8 == 0 work.
//   - Warpgroups 1 and 2: the consumers, 64 rows each. One m64n256k16 wgmma a k16 step over the gate and up rows
//     together (a 256-row B operand), committed per stage; a stage is released once the next stage's group is
//     issued and the one reading it has completed (wgmma.wait_group 1).
//   - Warps 1-3: the epilogue. The consumers round their accumulators to T into a staged tile in shared memory
//     and go on to the next tile's products; these warps compute silu(gate) * up from it (swiglu's arithmetic on
//     the rounded product, activation.cu) and store whole 16-byte chunks, overlapping the next tile's products.
// Same arithmetic as rms_norm + matmul + swiglu except the order of the k sums inside each product (cuBLASLt's is
// its own), so results match the composition to a rounding of gate or up (tests/ops/swiglu_gemm_cuda_test.cpp).
//
// rms_norm_linear takes it from 2,048 rows (swiglu_gemm_pays).
#include <algorithm>
#include <type_traits>

#include "../elementwise_math.h"
#include "attention_mma.cuh"
#include "attention_wgmma.cuh"
#include "common.cuh"
#include "cuda_backend.h"
#include "gemm_swiglu.h"
#include "microllm/backend/backend.h"
#include "microllm/backend/kernel_choices.h"
#include "microllm/core/error.h"
#include "op_scope.h"
#include "rows.cuh"
#include "tensor_map.h"

namespace microllm::cuda_kernels {
namespace sm90_swiglu {
namespace {

using attn::mbar_arrive;
using attn::mbar_expect_bytes;
using attn::mbar_init;
using attn::mbar_wait;
using attn::tma_load_2d;

constexpr int kBlockM = 128;                                  // rows of x a tile: two consumer warpgroups of 64
constexpr int kBlockN = 128;                                  // output columns a tile (gate rows; as many up rows)
constexpr int kThreads = 384;                                 // producer warpgroup + two consumer warpgroups
[[maybe_unused]] constexpr int kConsumerWarps = 8;            // arrivals that release a stage
[[maybe_unused]] constexpr int kConsumerThreads = 256;        // arrivals that hand over a finished tile
[[maybe_unused]] constexpr int kEpilogueThreads = 96;         // warps 1-3 of the producer warpgroup
constexpr int kStagedPitch = kBlockN + 8;                     // elements per staged row: rows 4 banks apart
constexpr int kStagedBytes = 2 * kBlockM * kStagedPitch * 2;  // a tile's rounded gate and up: 68 KB
constexpr int kBlockK = 64;                                   // a k slice: one 128-byte swizzle span a row
constexpr int kRowBytes = kBlockK * 2;
constexpr int kABytes = kBlockM * kRowBytes;            // x's slice: 16 KB
constexpr int kBHalfBytes = kBlockN * kRowBytes;        // the gate (or up) rows' slice: 16 KB
constexpr int kStageBytes = kABytes + 2 * kBHalfBytes;  // 48 KB
constexpr int kStages = 3;                              // what fits beside the staged tile
constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + kStagedBytes + 1024;  // + alignment to 1024

struct Args {
  int m, n, k;
  void* out;  // [m, n], rows out_stride elements apart
  int64_t out_stride;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// m64n256k16: d[128] = A B (+ d when accumulate), A and B from shared memory (K-major). The gate and the up
// rows of a tile are one 256-row B operand, so A is read once for both (two m64n128k16 read it twice).
#define MICROLLM_WGMMA_SS_256(TYPES)                                                                                 \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES                                                           \
      " "                                                                                                            \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                      \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                             \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                             \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                             \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                             \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                             \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                 \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "            \
      "%128, %129, p, 1, 1, 0, 0;\n}\n"                                                                              \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),      \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),      \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),      \
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),      \
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),      \
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),      \
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),      \
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), \
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),            \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),            \
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),            \
        "+f"(d[126]), "+f"(d[127])                                                                                   \
      : "l"(a), "l"(b), "r"(accumulate))

// d (+)= A B over one k16 step, m64n256k16, A and B descriptors (K-major).
template <typename T>
__device__ __forceinline__ void wgmma_ss_256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    MICROLLM_WGMMA_SS_256("bf16.bf16");
  } else {
    MICROLLM_WGMMA_SS_256("f16.f16");
  }
}

// Warps 1-3 of the producer warpgroup finish each tile while the consumers multiply the next one: the rounded
// gate and up rows a 16-byte chunk (8 columns) at a time, silu(gate) * up in f32 as the swiglu kernel computes it
// (activation.cu), rounded once, one 16-byte store each (a warp writes two whole 256-byte rows).
template <typename T, typename TileOrigin>
__device__ __forceinline__ void finish_tiles(const Args& a, const T* staged, uint32_t staged_full,
                                             uint32_t staged_empty, int tiles, TileOrigin origin) {
  constexpr int kChunks = kBlockN / 8;  // per row
  const int tid = static_cast<int>(threadIdx.x) - 32;
  unsigned phase = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int2 o = origin(tile);
    mbar_wait(staged_full, phase);
    phase ^= 1;
    for (int i = tid; i < kBlockM * kChunks; i += kEpilogueThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      const int row = o.x + r, col = o.y + c;
      if (row >= a.m || col >= a.n) continue;  // n % 8 == 0: a chunk is whole or past the end
      const uint4 gate8 = *reinterpret_cast<const uint4*>(staged + r * kStagedPitch + c);
      const uint4 up8 = *reinterpret_cast<const uint4*>(staged + (kBlockM + r) * kStagedPitch + c);
      const T* gate = reinterpret_cast<const T*>(&gate8);
      const T* up = reinterpret_cast<const T*>(&up8);
      alignas(16) T act[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        act[e] = from_acc<T>(math::swiglu(to_acc(gate[e]), to_acc(up[e])));
      }
      *reinterpret_cast<uint4*>(static_cast<T*>(a.out) + static_cast<int64_t>(row) * a.out_stride + col) =
          *reinterpret_cast<const uint4*>(act);
    }
    mbar_arrive(staged_empty);  // this thread's reads of the staged tile are done
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    swiglu_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap gate_map,
                       const __grid_constant__ CUtensorMap up_map, const Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages], staged_full, staged_empty;
  extern __shared__ unsigned char swiglu_gemm_smem[];
  const uint32_t smem0 = attn::smem_u32(swiglu_gemm_smem);
  const uint32_t ring = (smem0 + 1023u) & ~1023u;  // the swizzle's period
  // The tile's rounded gate rows, then its up rows, [kBlockM][kStagedPitch] each, after the ring.
  T* const staged = reinterpret_cast<T*>(swiglu_gemm_smem + (ring - smem0) + kStages * kStageBytes);
  const int tiles_m = (a.m + kBlockM - 1) / kBlockM;
  const int tiles = tiles_m * ((a.n + kBlockN - 1) / kBlockN);
  const int k_blocks = (a.k + kBlockK - 1) / kBlockK;
  // A tile's first row and first output column. Row blocks go fastest, so the CTAs at work at once share their
  // weight rows (from DRAM once, then L2 hits) and x stays in L2.
  auto origin = [&](int tile) { return make_int2((tile % tiles_m) * kBlockM, (tile / tiles_m) * kBlockN); };
  auto full_bar = [&](int s) { return attn::smem_u32(&full[s]); };
  auto empty_bar = [&](int s) { return attn::smem_u32(&empty[s]); };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kConsumerWarps);
    }
    mbar_init(attn::smem_u32(&staged_full), kConsumerThreads);
    mbar_init(attn::smem_u32(&staged_empty), kEpilogueThreads);
    attn::mbar_fence_init();  // visible to the TMA unit
  }
  __syncthreads();
  wait_for_prior_grids();  // x is the kernel before's output (a chained launch in a captured prefill)

  const int warp_in_cta = static_cast<int>(threadIdx.x) / 32;
  if (warp_in_cta == 0) {  // the producer: one thread issues every copy
    if (threadIdx.x == 0) {
      int stage = 0;
      unsigned phase = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int2 o = origin(tile);
        for (int kb = 0; kb < k_blocks; ++kb) {
          mbar_wait(empty_bar(stage), phase ^ 1);  // the consumers are done with the stage's last use
          const uint32_t dst = ring + static_cast<uint32_t>(stage * kStageBytes);
          mbar_expect_bytes(full_bar(stage), kStageBytes);
          tma_load_2d(dst, &x_map, full_bar(stage), kb * kBlockK, o.x);
          tma_load_2d(dst + kABytes, &gate_map, full_bar(stage), kb * kBlockK, o.y);
          tma_load_2d(dst + kABytes + kBHalfBytes, &up_map, full_bar(stage), kb * kBlockK, o.y);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    return;
  }
  if (warp_in_cta < 4) {  // warps 1-3: the epilogue
    finish_tiles<T>(a, staged, attn::smem_u32(&staged_full), attn::smem_u32(&staged_empty), tiles, origin);
    return;
  }

  // The consumers: warpgroup 1 rows 0-63 of the tile, warpgroup 2 rows 64-127.
  const int consumer = warp_in_cta / 4 - 1;
  const int warp = warp_in_cta % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  int stage = 0;
  unsigned phase = 0, staged_phase = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // acc[4 j + e]: row g + 8 (e / 2) of this warp's 16, column 8 j + 2 t + e % 2 of the 256 weight rows (the
    // tile's gate rows for j < 16, then its up rows).
    float acc[2 * kBlockN / 2];
    int previous = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(full_bar(stage), phase);
      const uint32_t a_rows = ring + static_cast<uint32_t>(stage * kStageBytes + consumer * 64 * kRowBytes);
      const uint32_t b_rows = ring + static_cast<uint32_t>(stage * kStageBytes + kABytes);  // gate, then up rows
      attn::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {  // a k16 step is 32 bytes along the (swizzled) rows
        wgmma_ss_256<T>(acc, attn::wgmma_desc(a_rows + kk * 32, 16, 1024), attn::wgmma_desc(b_rows + kk * 32, 16, 1024),
                        kb > 0 || kk > 0);
      }
      attn::wgmma_commit();
      attn::wgmma_wait<1>();  // the group before this one has read its stage: release it
      if (previous >= 0 && lane == 0) mbar_arrive(empty_bar(previous));
      previous = stage;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    attn::wgmma_wait<0>();
    attn::wgmma_fence_operands(acc);
    if (previous >= 0 && lane == 0) mbar_arrive(empty_bar(previous));

    // Hand the rounded products to the epilogue warps once they are done with the tile before.
    mbar_wait(attn::smem_u32(&staged_empty), staged_phase ^ 1);
    staged_phase ^= 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = consumer * 64 + warp * 16 + g + 8 * half;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const int e = 4 * j + 2 * half, c = 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(staged + r * kStagedPitch + c) = attn::pack2<T>(acc[e], acc[e + 1]);
        *reinterpret_cast<uint32_t*>(staged + (kBlockM + r) * kStagedPitch + c) =
            attn::pack2<T>(acc[64 + e], acc[64 + e + 1]);
      }
    }
    mbar_arrive(attn::smem_u32(&staged_full));
  }
#else
  __trap();  // built without sm_90a machine code: swiglu_gemm_available() keeps it from launching
#endif
}

// The tensor map of a [rows, cols] matrix of 16-bit elements (rows `stride` elements apart) read in boxes of
// box_rows x kBlockK with the 128-byte swizzle; out-of-range elements read as zeros.
CUtensorMap matrix_map(const void* base, DType dtype, int64_t rows, int64_t cols, int64_t stride, int box_rows) {
  const int64_t dims[2] = {cols, rows}, byte_strides[1] = {stride * 2};
  const uint32_t box[2] = {kBlockK, static_cast<uint32_t>(box_rows)};
  return swizzled_map("swiglu_gemm", base, dtype, 2, dims, byte_strides, box);
}

}  // namespace
}  // namespace sm90_swiglu

bool swiglu_gemm_available(int device) { return fused_swiglu_gemm() && sm90a_kernels(device); }

// From 2,048 rows: at 512 (R1-1.5B: 280 tiles, 2.1 per SM, its last round half empty) cuBLASLt's product and the
// swiglu kernel are faster (docs/perf/kernels.md#gemm_swiglu_sm90).
bool swiglu_gemm_pays(int64_t rows) { return rows >= 2048; }

bool swiglu_gemm_takes(const Tensor& x, const Tensor& w, const Tensor& out) {
  const DType dtype = x.dtype();
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  if (w.dtype() != dtype || out.dtype() != dtype || x.dim() != 2 || w.dim() != 2 || out.dim() != 2) return false;
  if (!x.device().is_cuda() || w.device() != x.device() || out.device() != x.device()) return false;
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  if (m < 1 || m > INT32_MAX || k < 8 || k % 8 != 0 || n < 8 || n % 8 != 0 || n > INT32_MAX / 2) return false;
  if (w.size(0) != 2 * n || w.size(1) != k || out.size(0) != m) return false;
  // TMA reads x and w, and the epilogue writes out, in 16-byte rows (w's up rows start n whole rows in).
  return rows::rows_aligned16(x) && rows::rows_aligned16(w) && rows::rows_aligned16(out) &&
         swiglu_gemm_available(x.device().index);
}

void swiglu_gemm(const Tensor& x, const Tensor& w, const Tensor& out, cudaStream_t stream) {
  namespace sg = sm90_swiglu;
  MICROLLM_CHECK(swiglu_gemm_takes(x, w, out), ShapeError, "swiglu_gemm", "x ", x.shape(), ", w ", w.shape(), ", out ",
                 out.shape(), ": not operands the kernel takes (swiglu_gemm_takes)");
  const int device = x.device().index;
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  const size_t half_bytes = static_cast<size_t>(n) * static_cast<size_t>(w.stride(0)) * 2;
  const sg::Args args{static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), out.data_ptr(), out.stride(0)};
  const int64_t tiles = ((m + sg::kBlockM - 1) / sg::kBlockM) * ((n + sg::kBlockN - 1) / sg::kBlockN);
  const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles, multiprocessor_count(device)));
  const CUtensorMap x_map = sg::matrix_map(x.data_ptr(), x.dtype(), m, k, x.stride(0), sg::kBlockM);
  const CUtensorMap gate_map = sg::matrix_map(w.data_ptr(), w.dtype(), n, k, w.stride(0), sg::kBlockN);
  const CUtensorMap up_map = sg::matrix_map(static_cast<const unsigned char*>(w.data_ptr()) + half_bytes, w.dtype(), n,
                                            k, w.stride(0), sg::kBlockN);
  auto launch = [&]<typename T>() {
    raise_smem_limit<sg::swiglu_gemm_kernel<T>>(static_cast<int>(sg::kSmemBytes), device);
    launch_chained(sg::swiglu_gemm_kernel<T>, dim3(grid), dim3(sg::kThreads), sg::kSmemBytes, stream, device, x_map,
                   gate_map, up_map, args);
  };
  if (x.dtype() == DType::bf16)
    launch.template operator()<__nv_bfloat16>();
  else
    launch.template operator()<__half>();
}

}  // namespace microllm::cuda_kernels

namespace microllm {

// At prefill size (swiglu_gemm_pays) and where the kernel takes the operands, one Hopper GEMM with SwiGLU in its
// epilogue; elsewhere (and with a bias) the default composition: cuBLASLt's product, then the swiglu kernel.
void CudaFusions::linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const bool fused =
      !bias.defined() && cuda_kernels::swiglu_gemm_pays(x.size(0)) && cuda_kernels::swiglu_gemm_takes(x, weight, out);
  if (recording_kernel_choices()) {
    record_kernel_choice("linear_swiglu",
                         "rows " + std::to_string(x.size(0)) + ", weight " + std::to_string(weight.size(0)) + "x" +
                             std::to_string(weight.size(1)),
                         fused ? "Hopper GEMM with SwiGLU in its epilogue" : "composition: matmul, swiglu");
  }
  if (fused) {
    const cuda_kernels::OpScope scope("swiglu_gemm", device_, detail::current_cuda_stream(device_));
    const cuda_kernels::Launch launch(out);
    cuda_kernels::swiglu_gemm(x, weight, out, launch.stream);
    return;
  }
  Fusions::linear_swiglu(x, weight, bias, out);
}

}  // namespace microllm
