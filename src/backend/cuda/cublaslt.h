// cuBLASLt as the CUDA backend uses it (internal header): checked calls, and the per-device handle and
// per-stream workspace that every GEMM shares. Both live as long as the process.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "microllm/core/error.h"

// Every cuBLASLt call goes through this: a failure throws BackendError naming the call, the status and
// file:line.
#define MICROLLM_CUBLAS_CHECK(expr)                                                                                \
  do {                                                                                                             \
    const cublasStatus_t microllm_cublas_status = (expr);                                                          \
    if (microllm_cublas_status != CUBLAS_STATUS_SUCCESS) {                                                         \
      throw ::microllm::BackendError(                                                                              \
          "cublasLt",                                                                                              \
          ::microllm::str_cat(#expr, " failed: ", cublasLtGetStatusName(microllm_cublas_status), " (",             \
                              cublasLtGetStatusString(microllm_cublas_status), ") at ", __FILE__, ":", __LINE__)); \
    }                                                                                                              \
  } while (0)

namespace microllm::cuda_kernels {

// The cuBLASLt handle of `device`, created on first use (the caller has made `device` current).
cublasLtHandle_t cublaslt_handle(int device);

// cuBLASLt's scratch memory for work on `stream` of `device`: 32 MiB from the caching allocator, taken on
// first use and kept. One buffer per stream, because kernels on two streams may run at the same time and
// a block of the caching allocator belongs to the stream that first took it.
struct CublasLtWorkspace {
  void* data;
  size_t bytes;
};
constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;
CublasLtWorkspace cublaslt_workspace(int device, cudaStream_t stream);

}  // namespace microllm::cuda_kernels
