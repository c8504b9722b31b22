// PLACEHOLDER (helper replaces): CPU rotary kernels.
#include "cpu_backend.h"
namespace microllm {
void CpuBackend::rope(const Tensor&, const Tensor&, const RopeParams&, bool, const Tensor&) { throw NotSupportedError("rope", "pending"); }
}  // namespace microllm
