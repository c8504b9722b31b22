#include "microllm/backend/backend.h"

#include "cpu/cpu_backend.h"

namespace microllm {

#ifdef MICROLLM_WITH_CUDA
Backend& cuda_backend(int device);  // src/backend/cuda/cuda_backend.cu
#endif

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
#ifdef MICROLLM_WITH_CUDA
  return cuda_backend(device.index);
#else
  throw NotSupportedError("backend", str_cat("no backend for ", device,
                                             ": this build of microLLM has no CUDA support (configure with "
                                             "-DMICROLLM_CUDA=ON, e.g. the cuda-release preset)"));
#endif
}

}  // namespace microllm
