// PLACEHOLDER (helper replaces): CPU attention kernels.
#include "cpu_backend.h"
namespace microllm {
void CpuBackend::attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&) { throw NotSupportedError("attention", "pending"); }
void CpuBackend::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { throw NotSupportedError("attention", "pending"); }
}  // namespace microllm
