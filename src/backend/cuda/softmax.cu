// PLACEHOLDER (being written): CUDA softmax kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::softmax(const Tensor&, bool, const Tensor&) { throw NotSupportedError("softmax", "softmax has no CUDA kernel yet"); }
void CudaBackend::softmax_backward(const Tensor&, const Tensor&, bool, const Tensor&) { throw NotSupportedError("softmax_backward", "softmax_backward has no CUDA kernel yet"); }

}  // namespace microllm
