#include "microllm/backend/backend.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cpu/cpu_backend.h"

namespace microllm {

#ifdef MICROLLM_WITH_CUDA
Backend& cuda_backend(int device);  // src/backend/cuda/cuda_backend.cu
#endif

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_deterministic{true};

// MICROLLM_GEMV: unset or "1" -> on, "0" -> off; anything else is a configuration mistake worth an error.
bool gemv_from_environment() {
  const char* env = std::getenv("MICROLLM_GEMV");
  if (env == nullptr || std::strcmp(env, "1") == 0) return true;
  if (std::strcmp(env, "0") == 0) return false;
  throw ValueError("backend", str_cat("MICROLLM_GEMV must be 0 or 1, got \"", env, "\""));
}

std::atomic<bool>& decode_gemv_flag() {
  static std::atomic<bool> flag{gemv_from_environment()};
  return flag;
}
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
void set_deterministic_algorithms(bool deterministic) {
  g_deterministic.store(deterministic, std::memory_order_relaxed);
}
bool deterministic_algorithms() { return g_deterministic.load(std::memory_order_relaxed); }
void set_decode_gemv(bool enabled) { decode_gemv_flag().store(enabled, std::memory_order_relaxed); }
bool decode_gemv() { return decode_gemv_flag().load(std::memory_order_relaxed); }

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
