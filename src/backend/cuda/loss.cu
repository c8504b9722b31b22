// PLACEHOLDER (being written): CUDA loss kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::cross_entropy(const Tensor&, const Tensor&, int64_t, const Tensor&) { throw NotSupportedError("cross_entropy", "cross_entropy has no CUDA kernel yet"); }
void CudaBackend::cross_entropy_backward(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) { throw NotSupportedError("cross_entropy_backward", "cross_entropy_backward has no CUDA kernel yet"); }

}  // namespace microllm
