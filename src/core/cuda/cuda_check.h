// Checked CUDA calls (internal header): every runtime call goes through MICROLLM_CUDA_CHECK, which throws
// BackendError naming the expression, the CUDA error and file:line.
#pragma once

#include <cuda_runtime.h>

#include "microllm/core/error.h"

#define MICROLLM_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                    \
    const cudaError_t microllm_cuda_status = (expr);                                                      \
    if (microllm_cuda_status != cudaSuccess) {                                                            \
      throw ::microllm::BackendError("cuda", ::microllm::str_cat(#expr, " failed: ",                      \
                                                                 cudaGetErrorString(microllm_cuda_status), \
                                                                 " at ", __FILE__, ":", __LINE__));        \
    }                                                                                                     \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at the next unrelated call.
#define MICROLLM_CUDA_CHECK_LAUNCH() MICROLLM_CUDA_CHECK(cudaGetLastError())

namespace microllm::detail {

// Makes `device` current on this thread for the guard's lifetime.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    MICROLLM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MICROLLM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CudaDeviceGuard() { cudaSetDevice(previous_); }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The current stream of `device` as a cudaStream_t (see microllm::cuda::current_stream).
cudaStream_t current_cuda_stream(int device);

}  // namespace microllm::detail
