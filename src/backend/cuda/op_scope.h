// OpScope: the first line of every CUDA backend method. It names the op for Nsight (an NVTX range)
// and, when op timing is on, brackets the op's kernels with CUDA events (internal header).
#pragma once

#include <cuda_runtime.h>

namespace microllm::cuda_kernels {

class OpScope {
 public:
  OpScope(const char* op, int device, cudaStream_t stream);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* op_;
  int device_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr;
};

}  // namespace microllm::cuda_kernels
