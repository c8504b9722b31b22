// CPU-only builds: every CUDA entry point of core says so clearly.
#include "device_runtime.h"
#include "microllm/core/error.h"

namespace microllm::detail {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw NotSupportedError(what, "this build of microLLM has no CUDA support (configure with -DMICROLLM_CUDA=ON, "
                                "e.g. the cuda-release preset)");
}
}  // namespace

int cuda_device_count_impl() { return 0; }
Allocator& cuda_allocator(int) { no_cuda("cuda allocator"); }
void cuda_copy_bytes(void*, Device, const void*, Device, size_t) { no_cuda("copy"); }
void cuda_fill_bytes(void*, int, int, size_t) { no_cuda("fill"); }
void cuda_copy_strided(const Tensor&, const Tensor&) { no_cuda("copy"); }

}  // namespace microllm::detail
