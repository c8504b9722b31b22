#include "op_scope.h"

#include <nvtx3/nvToolsExt.h>

#include "../../core/cuda/cuda_check.h"
#include "../op_timing_internal.h"
#include "microllm/backend/op_timing.h"

namespace microllm::cuda_kernels {

OpScope::OpScope(const char* op, int device, cudaStream_t stream)
    : op_(op), device_(device), stream_(stream), trace_(op, "op", device) {
  nvtxRangePushA(op);
  if (!op_timing_enabled()) return;
  MICROLLM_CUDA_CHECK(cudaEventCreate(&start_));
  MICROLLM_CUDA_CHECK(cudaEventRecord(start_, stream_));
}

OpScope::~OpScope() {
  if (start_) {
    cudaEvent_t end = nullptr;
    if (cudaEventCreate(&end) == cudaSuccess && cudaEventRecord(end, stream_) == cudaSuccess) {
      const cudaEvent_t start = start_;
      detail::record_op_time(op_, [start, end] {
        float ms = 0;
        cudaEventSynchronize(end);
        cudaEventElapsedTime(&ms, start, end);
        cudaEventDestroy(start);
        cudaEventDestroy(end);
        return static_cast<double>(ms);
      });
    }
  }
  nvtxRangePop();
}

}  // namespace microllm::cuda_kernels
