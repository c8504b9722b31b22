// PLACEHOLDER (being written): CUDA activation kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::swiglu(const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("swiglu", "swiglu has no CUDA kernel yet"); }
void CudaBackend::swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("swiglu_backward", "swiglu_backward has no CUDA kernel yet"); }

}  // namespace microllm
