// PLACEHOLDER (being written): CUDA attention kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&) { throw NotSupportedError("attention", "attention has no CUDA kernel yet"); }
void CudaBackend::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("attention_backward", "attention_backward has no CUDA kernel yet"); }

}  // namespace microllm
