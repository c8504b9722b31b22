// PLACEHOLDER (being written): CUDA reduce kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::reduce(ReduceOp, const Tensor&, int, const Tensor&) { throw NotSupportedError("reduce", "reduce has no CUDA kernel yet"); }
void CudaBackend::argmax(const Tensor&, int, const Tensor&) { throw NotSupportedError("argmax", "argmax has no CUDA kernel yet"); }
void CudaBackend::topk(const Tensor&, int64_t, const Tensor&, const Tensor&) { throw NotSupportedError("topk", "topk has no CUDA kernel yet"); }
void CudaBackend::scatter_add(const Tensor&, const Tensor&, int, const Tensor&) { throw NotSupportedError("scatter_add", "scatter_add has no CUDA kernel yet"); }
void CudaBackend::embedding(const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("embedding", "embedding has no CUDA kernel yet"); }
void CudaBackend::embedding_backward(const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("embedding_backward", "embedding_backward has no CUDA kernel yet"); }

}  // namespace microllm
