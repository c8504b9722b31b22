// PLACEHOLDER (helper replaces): CPU softmax kernels.
#include "cpu_backend.h"
namespace microllm {
void CpuBackend::softmax(const Tensor&, bool, const Tensor&) { throw NotSupportedError("softmax", "pending"); }
void CpuBackend::softmax_backward(const Tensor&, const Tensor&, bool, const Tensor&) { throw NotSupportedError("softmax", "pending"); }
}  // namespace microllm
