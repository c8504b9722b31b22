// Shared device code of the CUDA backend (internal header): storage types and their f32 views, dtype
// dispatch, launch helpers, strided indexing and warp/block reductions. Kernels use only what this
// header and portability.h give them, so a HIP port replaces these two files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../../core/cuda/cuda_check.h"
#include "../../core/merge_dims.h"
#include "microllm/backend/portability.h"
#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels {

// ---- storage types: DType -> CUDA type, and loads/stores through the accumulation type ----
// A is float for every storage type except double.
template <typename T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T> __device__ __forceinline__ acc_t<T> to_acc(T v) { return static_cast<acc_t<T>>(v); }
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// v rounded to the storage type and read back: HF keeps intermediates such as a norm's h * rstd or an activation's
// output in the model dtype.
template <typename T>
__device__ __forceinline__ acc_t<T> round_to(acc_t<T> v) {
  return to_acc(from_acc<T>(v));
}

[[noreturn]] inline void no_kernel(const char* op, DType dtype) {
  throw NotSupportedError(op, str_cat(op, " has no CUDA kernel for ", dtype));
}

// fn.template operator()<T>() with T the CUDA storage type of a floating dtype.
template <typename Fn>
decltype(auto) visit_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<__half>();
    case DType::bf16: return fn.template operator()<__nv_bfloat16>();
    default: no_kernel(op, dtype);
  }
}

// Floating types plus the integers (comparisons, where, scatter, ...); integers compute in int64.
template <typename Fn>
decltype(auto) visit_numeric(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::i8: return fn.template operator()<int8_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    default: return visit_float(dtype, op, fn);
  }
}

// ---- vector loads ----
// Eight consecutive elements (16-byte aligned) as f32: one 16-byte load for f16/bf16, two for f32.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&x)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = to_acc(e[i]);
}

// 16 bytes from global to shared memory without a trip through registers (cp.async, sm_80 and later; L1
// bypassed), so a thread can have many copies in flight; both addresses 16-byte aligned. copy_async_wait_all()
// waits for the calling thread's copies (a barrier then publishes them to the block). kPrefetch256: L2 also
// fetches the 256 bytes around it (a streamed read whose next chunks follow). The memory clobber keeps the
// compiler from moving a read of the destination past the copy that overwrites it. Elsewhere (a HIP port,
// older GPUs) a plain 16-byte copy: the same result without the overlap.
template <bool kPrefetch256 = false>
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kPrefetch256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  }
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
// cp.async groups: commit closes the group of the thread's copies issued since the last commit (an empty group
// is allowed); wait_group<N> returns once at most N of the thread's most recent groups are still in flight.
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copy_async_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void copy_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// ---- chained launches (programmatic dependent launch, sm_90) ----
// A decode step is ~200 small dependent kernels; between two of them the GPU idles while the next one
// launches and loads its prologue. A kernel launched with launch_chained may instead start while the kernel
// before it on the stream is still running, so that gap overlaps the previous kernel's tail. Such a kernel
// calls wait_for_prior_grids() before it reads anything a kernel may have written (it returns once the
// kernel before has finished and its writes are visible; transitively, every earlier kernel too) and
// chain_next_grids() to let the next chained kernel launch early. Both are no-ops before sm_90, in a HIP
// port, or when the kernel was launched plainly.
// Launches are chained only while the stream is being captured into a CUDA graph: the engine's decode
// steps and prefill chunks, where no kernel writes a weight, so a chained kernel may load its weights
// (RMSNorm's, a GEMV's) before it waits; paged_decode_attention likewise stages the KV cache's rows of earlier
// steps (the step's positions and block tables are on the device before the graph runs: uploaded, or moved on
// by the step before's last kernel, paged_decode_advance, which writes them only after its own wait).
// Outside a capture (training, eager forwards) every launch is plain and waits in stream order.
// MICROLLM_DISABLE=pdl makes every launch plain (an A/B switch).
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void chain_next_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launches on `device` may be chained: compute capability 9.0 or later and MICROLLM_DISABLE without pdl.
bool chained_launches(int device);
// Multiprocessors of `device` (read once; launch shapes ask on every call).
int multiprocessor_count(int device);
// 10 x major + minor of `device` (90 for an H100 / H200), read once.
int compute_capability(int device);
// Whether the Hopper-only kernels (wgmma, TMA: sm_90a machine code) can run on `device`: the build has sm_90a code
// (MICROLLM_CUDA_SM90A, set where the architectures include it) and the device is compute capability 9.0.
inline bool sm90a_kernels(int device) {
#if defined(MICROLLM_CUDA_SM90A)
  return compute_capability(device) == 90;
#else
  (void)device;
  return false;
#endif
}
// The most dynamic shared memory a CTA of `device` may opt in to (227 KB on an H100 / H200), read once.
int max_shared_memory_optin(int device);

// launch_chained in thread-block clusters of `cluster` CTAs along x (sm_90; 1: no clusters). The CTAs of a
// cluster run at the same time on one GPC and may read each other's shared memory; grid.x must be a multiple
// of `cluster`, and more than 8 needs the kernel's cudaFuncAttributeNonPortableClusterSizeAllowed.
template <typename... Params, typename... Args>
void launch_chained_in_clusters(unsigned cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, int device, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster, 1, 1};
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (chained_launches(device)) MICROLLM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusActive) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  MICROLLM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, int device,
                    Args&&... args) {
  launch_chained_in_clusters(1, kernel, grid, block, smem, stream, device, std::forward<Args>(args)...);
}

// ---- launching ----
// The device and stream a kernel runs on: the output's device, its current stream.
struct Launch {
  int device;
  cudaStream_t stream;
  detail::CudaDeviceGuard guard;
  explicit Launch(const Tensor& out)
      : device(out.device().index), stream(detail::current_cuda_stream(out.device().index)), guard(device) {}
};

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n items (capped: each thread loops over the rest).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535 * 8));
}

#define MICROLLM_GRID_STRIDE_LOOP(i, n)                                                              \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);             \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- strided indexing: N operands sharing one logical shape, dims merged on the host ----
template <int N>
struct StridedMeta {
  int rank;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];

  // Element offsets of logical element `linear` in each operand.
  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = linear % shape[d];
      linear /= shape[d];
      for (int k = 0; k < N; ++k) out[k] += i * strides[k][d];
    }
  }
};

// Merges dims that are contiguous in every operand (a contiguous tensor becomes rank 1).
template <int N>
StridedMeta<N> make_strided_meta(const Shape& shape, const std::array<Strides, N>& strides) {
  const detail::RowLayout<N> layout = detail::merge_dims<N>(shape, strides);
  StridedMeta<N> meta{};
  meta.rank = layout.shape.size();
  for (int d = 0; d < meta.rank; ++d) {
    meta.shape[d] = layout.shape[d];
    for (int k = 0; k < N; ++k) meta.strides[k][d] = layout.strides[k][d];
  }
  return meta;
}

// True when every operand is contiguous in the merged layout (one dim, unit stride).
template <int N>
bool all_contiguous(const StridedMeta<N>& meta) {
  if (meta.rank != 1) return false;
  for (int k = 0; k < N; ++k) {
    if (meta.strides[k][0] != 1) return false;
  }
  return true;
}

// Raises Kernel's dynamic shared-memory limit to `bytes` (past the 48 KiB that need no opt-in) on `device`, the
// current device, once per kernel and device: a host attribute, so it may run while a stream is being captured.
// One size per kernel: later calls with other sizes do nothing, so pass the most any launch of it asks for.
template <auto Kernel>
void raise_smem_limit(int bytes, int device) {
  static std::atomic<uint64_t> done{0};  // one bit per device (devices 0..63)
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (done.load(std::memory_order_relaxed) & bit) return;
  MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit);
}

// ---- reductions inside a warp and a block ----
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += MICROLLM_SHFL_XOR(v, offset);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, MICROLLM_SHFL_XOR(v, offset));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values of shared memory.
template <typename A>
__device__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : A(0);
  return warp_sum(v);
}

template <typename A>
__device__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace microllm::cuda_kernels
