// Timing cuBLASLt's candidate algorithms for one GEMM (gemm_tuning.h).
#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <tuple>
#include <vector>

#include "../../core/cuda/cuda_check.h"
#include "common.cuh"
#include "gemm_tuning.h"
#include "microllm/core/cuda.h"

namespace microllm::cuda_kernels {
namespace {

constexpr int kRounds = 2;        // passes over the candidates; a candidate's time is its best pass
constexpr int kRunsPerRound = 3;  // back-to-back runs timed together, after one untimed run
constexpr int kMaxDevices = 64;

std::atomic<int64_t> g_tuning_runs{0};

// Uniform values in [-1, 1) from a hash of the index: operands whose bits toggle like real ones (the clocks a
// GEMM runs at depend on it; zeros would flatter every candidate alike but not equally).
template <typename T>
__global__ void fill_uniform(T* __restrict__ out, int64_t n, uint32_t seed) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    out[i] = from_acc<T>(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// flag = 1 when the 16-bit words of x and y differ anywhere.
__global__ void any_difference(const uint16_t* __restrict__ x, const uint16_t* __restrict__ y, int64_t n, int* flag) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    if (x[i] != y[i]) *flag = 1;
  }
}

// A stream of each device for the timing runs (cuda::Stream::create: non-blocking, so work on it neither waits
// for the legacy stream nor is recorded by a capture on another stream), created on first use and kept.
const cuda::Stream& tuning_stream(int device) {
  static std::mutex mutex;
  static std::array<cuda::Stream, kMaxDevices> streams{};
  MICROLLM_CHECK(device >= 0 && device < kMaxDevices, DeviceError, "matmul", "device index ", device, " out of range");
  std::lock_guard<std::mutex> lock(mutex);
  cuda::Stream& stream = streams[static_cast<size_t>(device)];
  if (!stream.handle()) stream = cuda::Stream::create(device);
  return stream;
}

// Stream-ordered scratch memory on the tuning stream, returned when the tuning is done.
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    for (void* p : blocks_) cudaFreeAsync(p, stream_);
    cudaStreamSynchronize(stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // nullptr when the device has no memory to spare for it.
  void* take(size_t bytes) {
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, bytes, stream_);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so the next launch does not report it
      return nullptr;
    }
    MICROLLM_CUDA_CHECK(status);
    blocks_.push_back(p);
    return p;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};

template <typename T>
void fill(void* p, size_t bytes, uint32_t seed, cudaStream_t stream) {
  const auto n = static_cast<int64_t>(bytes / sizeof(T));
  fill_uniform<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(p), n, seed);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

// Whether the bytes of x and y are the same (16-bit words; the caller's stream is synchronized).
bool same_output(const void* x, const void* y, size_t bytes, int* differs, cudaStream_t stream) {
  const auto n = static_cast<int64_t>(bytes / sizeof(uint16_t));
  MICROLLM_CUDA_CHECK(cudaMemsetAsync(differs, 0, sizeof(int), stream));
  any_difference<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(y),
                                                       n, differs);
  MICROLLM_CUDA_CHECK_LAUNCH();
  int host = 0;
  MICROLLM_CUDA_CHECK(cudaMemcpyAsync(&host, differs, sizeof(int), cudaMemcpyDeviceToHost, stream));
  MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host == 0;
}

}  // namespace

int fastest_algo(cublasLtHandle_t handle, const TunedGemm& gemm, const cublasLtMatmulAlgo_t* candidates, int count,
                 int device) {
  if (count < 2) return 0;
  const cuda::Stream& timing_stream = tuning_stream(device);
  const auto stream = static_cast<cudaStream_t>(timing_stream.handle());
  Scratch scratch(stream);
  void* a = scratch.take(gemm.a_bytes);
  void* b = a ? scratch.take(gemm.b_bytes) : nullptr;
  void* c = b ? scratch.take(gemm.c_bytes) : nullptr;
  void* workspace = c ? scratch.take(kCublasLtWorkspaceBytes) : nullptr;
  void* reference = workspace && gemm.same_bits ? scratch.take(gemm.c_bytes) : nullptr;  // candidate 0's output
  int* differs = workspace ? static_cast<int*>(scratch.take(sizeof(int))) : nullptr;
  if (!differs || (gemm.same_bits && !reference)) return 0;
  g_tuning_runs.fetch_add(1, std::memory_order_relaxed);
  const bool bf16 = gemm.dtype == DType::bf16;
  for (auto [p, bytes, seed] : {std::tuple{a, gemm.a_bytes, 1u}, {b, gemm.b_bytes, 2u}, {c, gemm.c_bytes, 3u}}) {
    if (bf16)
      fill<__nv_bfloat16>(p, bytes, seed, stream);
    else
      fill<__half>(p, bytes, seed, stream);
  }

  cuda::Event start(device), end(device);

  const float alpha = 1.f, beta = 0.f;  // bf16 / f16 accumulate in f32 (matmul.cu's plans)
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, gemm.desc, &alpha, a, gemm.a, b, gemm.b, &beta, c, gemm.c, c, gemm.c, &algo,
                          workspace, kCublasLtWorkspaceBytes, stream);
  };
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  const auto n = static_cast<size_t>(count);
  std::vector<float> best(n, kFailed);  // each candidate's best time of kRunsPerRound runs
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < n; ++i) {
      if (round > 0 && best[i] == kFailed) continue;  // it did not run the first time
      if (run(candidates[i]) != CUBLAS_STATUS_SUCCESS) continue;
      start.record(timing_stream);
      bool ran = true;
      for (int r = 0; r < kRunsPerRound && ran; ++r) ran = run(candidates[i]) == CUBLAS_STATUS_SUCCESS;
      end.record(timing_stream);
      end.synchronize();
      const float ms = cuda::Event::elapsed_ms(start, end);
      if (!ran) continue;
      if (gemm.same_bits && round == 0) {  // c holds candidate i's output: keep 0's, compare the others' to it
        if (i == 0) {
          MICROLLM_CUDA_CHECK(cudaMemcpyAsync(reference, c, gemm.c_bytes, cudaMemcpyDeviceToDevice, stream));
        } else if (!same_output(c, reference, gemm.c_bytes, differs, stream)) {
          continue;  // never timed again: it stays kFailed
        }
      }
      best[i] = std::min(best[i], ms);
    }
  }
  MICROLLM_CUDA_CHECK(cudaGetLastError());
  const auto fastest = std::min_element(best.begin(), best.end()) - best.begin();  // 0 when every one failed
  return static_cast<int>(fastest);
}

int64_t gemm_tuning_runs() { return g_tuning_runs.load(std::memory_order_relaxed); }

}  // namespace microllm::cuda_kernels
