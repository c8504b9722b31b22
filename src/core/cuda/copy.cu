// Moving bytes with CUDA: host <-> device copies through pinned staging buffers, device copies, and the
// strided copy-with-cast kernel behind Tensor::copy_ / contiguous() / to(dtype) on CUDA tensors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>

#include "../device_runtime.h"
#include "cuda_check.h"
#include "device_errors.h"
#include "microllm/core/cuda.h"
#include "microllm/core/tensor.h"

namespace microllm::detail {
namespace {

// ---- transfer counters ----
std::atomic<uint64_t> g_h2d{0}, g_h2d_bytes{0}, g_d2h{0}, g_d2h_bytes{0}, g_d2d{0}, g_d2d_bytes{0};
void count_copy(std::atomic<uint64_t>& copies, std::atomic<uint64_t>& bytes, size_t nbytes) {
  ++copies;
  bytes += nbytes;
}

// ---- pinned staging: two buffers, so the host fills one while the copy engine drains the other ----
constexpr size_t kStagingBytes = size_t{8} << 20;
constexpr size_t kDirectCopyBelow = size_t{256} << 10;  // small copies: the driver's own path is faster

struct Staging {
  std::mutex mutex;
  void* buffers[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
};

Staging& staging_for(int device) {
  static std::mutex mutex;
  static Staging* per_device[64] = {};
  std::lock_guard<std::mutex> lock(mutex);
  Staging*& s = per_device[device];
  if (!s) {
    s = new Staging();  // never freed: lives as long as the process, like the driver's context
    CudaDeviceGuard guard(device);
    for (int i = 0; i < 2; ++i) {
      MICROLLM_CUDA_CHECK(cudaHostAlloc(&s->buffers[i], kStagingBytes, cudaHostAllocDefault));
      MICROLLM_CUDA_CHECK(cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming));
    }
  }
  return *s;
}

void host_to_device(void* dst, const void* src, size_t nbytes, int device) {
  CudaDeviceGuard guard(device);
  const cudaStream_t stream = current_cuda_stream(device);
  if (nbytes < kDirectCopyBelow) {
    MICROLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
    MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  Staging& staging = staging_for(device);
  std::lock_guard<std::mutex> lock(staging.mutex);
  for (size_t offset = 0, chunk = 0; offset < nbytes; offset += kStagingBytes, ++chunk) {
    const int slot = static_cast<int>(chunk % 2);
    const size_t n = std::min(kStagingBytes, nbytes - offset);
    if (chunk >= 2) MICROLLM_CUDA_CHECK(cudaEventSynchronize(staging.done[slot]));  // slot drained?
    std::memcpy(staging.buffers[slot], static_cast<const char*>(src) + offset, n);
    MICROLLM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + offset, staging.buffers[slot], n,
                                        cudaMemcpyHostToDevice, stream));
    MICROLLM_CUDA_CHECK(cudaEventRecord(staging.done[slot], stream));
  }
  MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void device_to_host(void* dst, const void* src, size_t nbytes, int device) {
  CudaDeviceGuard guard(device);
  const cudaStream_t stream = current_cuda_stream(device);
  if (nbytes < kDirectCopyBelow) {
    MICROLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
    MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  Staging& staging = staging_for(device);
  std::lock_guard<std::mutex> lock(staging.mutex);
  const size_t chunks = (nbytes + kStagingBytes - 1) / kStagingBytes;
  auto issue = [&](size_t chunk) {
    const int slot = static_cast<int>(chunk % 2);
    const size_t offset = chunk * kStagingBytes;
    MICROLLM_CUDA_CHECK(cudaMemcpyAsync(staging.buffers[slot], static_cast<const char*>(src) + offset,
                                        std::min(kStagingBytes, nbytes - offset), cudaMemcpyDeviceToHost, stream));
    MICROLLM_CUDA_CHECK(cudaEventRecord(staging.done[slot], stream));
  };
  issue(0);
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + 1 < chunks) issue(chunk + 1);  // the next chunk lands while this one is copied out
    const int slot = static_cast<int>(chunk % 2);
    const size_t offset = chunk * kStagingBytes;
    MICROLLM_CUDA_CHECK(cudaEventSynchronize(staging.done[slot]));
    std::memcpy(static_cast<char*>(dst) + offset, staging.buffers[slot], std::min(kStagingBytes, nbytes - offset));
  }
}

#define MICROLLM_GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);             \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- strided copy with dtype conversion ----
struct StridedCopyArgs {
  int rank;
  int64_t shape[kMaxDims];
  int64_t dst_strides[kMaxDims];
  int64_t src_strides[kMaxDims];
  int64_t numel;
};

__device__ inline double load_as_double(const void* p, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f8_e4m3fn: return to_float(static_cast<const f8_e4m3fn*>(p)[i]);
    case DType::f8_e5m2: return to_float(static_cast<const f8_e5m2*>(p)[i]);
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

__device__ inline int64_t load_as_int(const void* p, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    default: return static_cast<const int64_t*>(p)[i];
  }
}

template <typename T>
__device__ inline T saturate_to(double v) {  // float -> integer: truncate, saturate, NaN -> 0
  if (isnan(v)) return T(0);
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

__device__ inline void store_from_double(void* p, int64_t i, DType dtype, double v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    case DType::f8_e4m3fn: static_cast<f8_e4m3fn*>(p)[i] = f8_e4m3fn_from_float(static_cast<float>(v)); break;
    case DType::f8_e5m2: static_cast<f8_e5m2*>(p)[i] = f8_e5m2_from_float(static_cast<float>(v)); break;
    case DType::i8: static_cast<int8_t*>(p)[i] = saturate_to<int8_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = saturate_to<uint8_t>(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = saturate_to<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = saturate_to<int64_t>(v); break;
  }
}

__device__ inline bool is_integer_dtype(DType d) {
  return d == DType::i8 || d == DType::u8 || d == DType::i32 || d == DType::i64;
}

__global__ void copy_strided_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                                    StridedCopyArgs args) {
  const bool int_to_int = is_integer_dtype(src_dtype) && is_integer_dtype(dst_dtype);
  for (int64_t linear = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; linear < args.numel;
       linear += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = linear, d_off = 0, s_off = 0;
    for (int d = args.rank - 1; d >= 0; --d) {
      const int64_t i = rest % args.shape[d];
      rest /= args.shape[d];
      d_off += i * args.dst_strides[d];
      s_off += i * args.src_strides[d];
    }
    if (int_to_int) {
      const int64_t v = load_as_int(src, s_off, src_dtype);
      switch (dst_dtype) {  // integer narrowing wraps, as on the CPU
        case DType::i8: static_cast<int8_t*>(dst)[d_off] = static_cast<int8_t>(v); break;
        case DType::u8: static_cast<uint8_t*>(dst)[d_off] = static_cast<uint8_t>(v); break;
        case DType::i32: static_cast<int32_t*>(dst)[d_off] = static_cast<int32_t>(v); break;
        default: static_cast<int64_t*>(dst)[d_off] = v; break;
      }
    } else {
      store_from_double(dst, d_off, dst_dtype, load_as_double(src, s_off, src_dtype));
    }
  }
}

// ---- the common case: a contiguous cast between floating types (weights to bf16, activations to f32):
// typed loads and stores, 16-byte vectors of the narrower side, no per-element dtype switch ----
template <typename T> __device__ __forceinline__ float to_f32(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// At most 16-byte alignment: a 32-byte pack of f32 loads as two 16-byte halves.
template <int N, typename T>
struct alignas(sizeof(T) * N > 16 ? 16 : sizeof(T) * N) Pack {
  T v[N];
};

template <typename Src, typename Dst>
__global__ void cast_contiguous_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, int64_t n) {
  constexpr int V = 8;  // 8 elements: 16 bytes of bf16/f16, two 16-byte halves of f32
  const int64_t packs = n / V;
  MICROLLM_GRID_STRIDE(p, packs) {
    const Pack<V, Src> in = reinterpret_cast<const Pack<V, Src>*>(src)[p];
    Pack<V, Dst> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_f32<Dst>(to_f32(in.v[j]));
    reinterpret_cast<Pack<V, Dst>*>(dst)[p] = out;
  }
  MICROLLM_GRID_STRIDE(i, n - packs * V) dst[packs * V + i] = from_f32<Dst>(to_f32(src[packs * V + i]));
}

// Launches the typed cast when both dtypes are f32, f16 or bf16 and both sides are 16-byte aligned.
bool try_cast_contiguous(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(src) || !aligned(dst)) return false;
  auto launch = [&]<typename S, typename D>() {
    const int threads = 256;
    const int64_t blocks = std::clamp<int64_t>((n / 8 + threads - 1) / threads, 1, 65536);
    cast_contiguous_kernel<S, D><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<const S*>(src),
                                                                                       static_cast<D*>(dst), n);
    return true;
  };
  auto with_dst = [&]<typename S>() {
    switch (dst_dtype) {
      case DType::f32: return launch.template operator()<S, float>();
      case DType::f16: return launch.template operator()<S, __half>();
      case DType::bf16: return launch.template operator()<S, __nv_bfloat16>();
      default: return false;
    }
  };
  switch (src_dtype) {
    case DType::f32: return with_dst.template operator()<float>();
    case DType::f16: return with_dst.template operator()<__half>();
    case DType::bf16: return with_dst.template operator()<__nv_bfloat16>();
    default: return false;
  }
}

__global__ void fill_kernel(void* dst, DType dtype, double value, int64_t numel) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_from_double(dst, i, dtype, value);
  }
}

}  // namespace

void cuda_fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  const int device = dst.device().index;
  CudaDeviceGuard guard(device);
  const cudaStream_t stream = current_cuda_stream(device);
  if (value == 0 && !std::signbit(value)) {  // +0 is all-zero bits in every dtype
    MICROLLM_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream));
    return;
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((dst.numel() + threads - 1) / threads, 65536);
  fill_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(dst.data_ptr(), dst.dtype(), value, dst.numel());
  MICROLLM_CUDA_CHECK_LAUNCH();
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cuda() && src_device.is_cpu()) {
    host_to_device(dst, src, nbytes, dst_device.index);
    count_copy(g_h2d, g_h2d_bytes, nbytes);
  } else if (dst_device.is_cpu() && src_device.is_cuda()) {
    device_to_host(dst, src, nbytes, src_device.index);
    count_copy(g_d2h, g_d2h_bytes, nbytes);
    check_cuda_device_errors(src_device.index);  // the host waited for the device: read its reports
  } else if (dst_device.is_cuda() && src_device.is_cuda()) {
    CudaDeviceGuard guard(dst_device.index);
    const cudaStream_t stream = current_cuda_stream(dst_device.index);
    if (dst_device.index == src_device.index) {
      MICROLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      MICROLLM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
      MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    count_copy(g_d2d, g_d2d_bytes, nbytes);
  } else {
    throw DeviceError("copy", "host to host copies do not go through CUDA");
  }
}

void cuda_copy_strided(const Tensor& src, const Tensor& dst) {
  const int device = dst.device().index;
  CudaDeviceGuard guard(device);
  const cudaStream_t stream = current_cuda_stream(device);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel()) {
    MICROLLM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel() &&
      try_cast_contiguous(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), dst.numel(), stream)) {
    MICROLLM_CUDA_CHECK_LAUNCH();
    return;
  }
  StridedCopyArgs args{};
  args.rank = dst.dim();
  args.numel = dst.numel();
  for (int d = 0; d < dst.dim(); ++d) {
    args.shape[d] = dst.size(d);
    args.dst_strides[d] = dst.stride(d);
    args.src_strides[d] = src.stride(d);
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((args.numel + threads - 1) / threads, 65536);
  copy_strided_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(dst.data_ptr(), dst.dtype(),
                                                                             src.data_ptr(), src.dtype(), args);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

}  // namespace microllm::detail

namespace microllm::cuda {

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  // Portable: pinned for every device's copies, not only the current one's; mapped: kernels may address it.
  MICROLLM_CUDA_CHECK(cudaHostAlloc(&data_, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped));
}

void* PinnedBuffer::device_data() const {
  void* device = nullptr;
  MICROLLM_CUDA_CHECK(cudaHostGetDevicePointer(&device, data_, 0));
  return device;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

struct UploadStaging::Arena {
  PinnedBuffer buffer;
  size_t used = 0;
  std::optional<Event> copied;  // recorded after each copy from this arena
};

UploadStaging::UploadStaging(const Stream& stream, size_t arena_bytes)
    : stream_(stream), arena_bytes_(std::max<size_t>(arena_bytes, 16)), arenas_(std::make_unique<Arena[]>(2)) {}

UploadStaging::~UploadStaging() {
  // Copies still enqueued read the arenas: let them finish before the memory goes back.
  try {
    stream_.synchronize();
  } catch (...) {  // a destructor must not throw; a failed stream ran nothing more anyway
  }
}

void UploadStaging::upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const auto fits = [&](const Arena& a) { return (a.used + 15) / 16 * 16 + bytes <= a.buffer.bytes(); };
  if (!fits(arenas_[current_])) {
    current_ ^= 1;  // the other arena, once the stream has passed its last copy
    Arena& next = arenas_[current_];
    if (next.used > 0) {
      next.copied->synchronize();
      ++waits_;
    }
    next.used = 0;
    if (!fits(next)) {  // empty (its copies are done): it may be replaced
      if (next.buffer.data()) ++grows_;
      next.buffer = PinnedBuffer(std::max(arena_bytes_, (bytes + 15) / 16 * 16));
    }
  }
  Arena& a = arenas_[current_];
  const size_t offset = (a.used + 15) / 16 * 16;
  char* staged = static_cast<char*>(a.buffer.data()) + offset;
  std::memcpy(staged, src, bytes);
  copy_async(dst, staged, bytes, CopyDirection::host_to_device, stream_);
  if (!a.copied) a.copied.emplace(stream_.device());
  a.copied->record(stream_);
  a.used = offset + bytes;
}

void copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction, const Stream& stream) {
  if (bytes == 0) return;
  detail::CudaDeviceGuard guard(stream.device());
  const bool up = direction == CopyDirection::host_to_device;
  if (up) detail::count_copy(detail::g_h2d, detail::g_h2d_bytes, bytes);
  else detail::count_copy(detail::g_d2h, detail::g_d2h_bytes, bytes);
  MICROLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                      static_cast<cudaStream_t>(stream.handle())));
}

TransferStats transfer_stats() {
  using namespace microllm::detail;
  return {g_h2d.load(), g_h2d_bytes.load(), g_d2h.load(), g_d2h_bytes.load(), g_d2d.load(), g_d2d_bytes.load()};
}

void reset_transfer_stats() {
  using namespace microllm::detail;
  for (auto* counter : {&g_h2d, &g_h2d_bytes, &g_d2h, &g_d2h_bytes, &g_d2d, &g_d2d_bytes}) counter->store(0);
}

}  // namespace microllm::cuda
