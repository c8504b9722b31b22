// PLACEHOLDER (being written): CUDA rope kernels.
#include "cuda_backend.h"

namespace microllm {

void CudaBackend::rope(const Tensor&, const Tensor&, const RopeParams&, bool, const Tensor&) { throw NotSupportedError("rope", "rope has no CUDA kernel yet"); }

}  // namespace microllm
