// PLACEHOLDER (being written): CUDA norm kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::rms_norm(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("rms_norm", "rms_norm has no CUDA kernel yet"); }
void CudaBackend::rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("rms_norm_backward", "rms_norm_backward has no CUDA kernel yet"); }

}  // namespace microllm
