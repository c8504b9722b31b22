// PLACEHOLDER (being written): CUDA matmul kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::matmul(const Tensor&, const Tensor&, bool, bool, const Tensor&, const Tensor&) { throw NotSupportedError("matmul", "matmul has no CUDA kernel yet"); }

}  // namespace microllm
