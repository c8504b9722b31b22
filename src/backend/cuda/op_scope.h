// OpScope: the first line of every CUDA backend method. It names the op for Nsight (an NVTX range), brackets the
// op's kernels with CUDA events when op timing is on, and, while a trace session runs, records the op's GPU span
// (profile::GpuScope, category "op") (internal header).
#pragma once

#include <cuda_runtime.h>

#include "microllm/profile/trace.h"

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
  profile::GpuScope trace_;
};

}  // namespace microllm::cuda_kernels
