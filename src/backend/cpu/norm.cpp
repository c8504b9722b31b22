// PLACEHOLDER (helper replaces): CPU RMSNorm kernels.
#include "cpu_backend.h"
namespace microllm {
void CpuBackend::rms_norm(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("rms_norm", "pending"); }
void CpuBackend::rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("rms_norm", "pending"); }
}  // namespace microllm
