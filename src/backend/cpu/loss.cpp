// PLACEHOLDER (helper replaces): CPU cross-entropy kernels.
#include "cpu_backend.h"
namespace microllm {
void CpuBackend::cross_entropy(const Tensor&, const Tensor&, int64_t, const Tensor&) { throw NotSupportedError("cross_entropy", "pending"); }
void CpuBackend::cross_entropy_backward(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) { throw NotSupportedError("cross_entropy", "pending"); }
}  // namespace microllm
