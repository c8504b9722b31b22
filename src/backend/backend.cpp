#include "microllm/backend/backend.h"

#include <atomic>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cpu/cpu_backend.h"
#include "environment.h"
#include "microllm/profile/trace.h"
#include "tracing_backend.h"

namespace microllm {

#ifdef MICROLLM_WITH_CUDA
Backend& cuda_backend(int device);  // src/backend/cuda/cuda_backend.cpp
#endif
Fusions& fusions_of(Device device, Backend& primitives);  // fusions.cpp

namespace {
std::atomic<bool> g_allow_tf32{false};

using detail::FastPath;
using detail::path_disabled;

std::atomic<bool>& decode_gemv_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::gemv)};
  return flag;
}

std::atomic<bool>& deterministic_flag() {
  static std::atomic<bool> flag{detail::deterministic_from_environment()};
  return flag;
}

std::atomic<bool>& gemm_tuning_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::gemm_tuning)};
  return flag;
}

std::atomic<bool>& fused_swiglu_gemm_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::swiglu_gemm)};
  return flag;
}

std::atomic<bool>& flash_wgmma_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::flash_wgmma)};
  return flag;
}
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
void set_deterministic_algorithms(bool deterministic) {
  deterministic_flag().store(deterministic, std::memory_order_relaxed);
}
bool deterministic_algorithms() { return deterministic_flag().load(std::memory_order_relaxed); }
void set_decode_gemv(bool enabled) { decode_gemv_flag().store(enabled, std::memory_order_relaxed); }
bool decode_gemv() { return decode_gemv_flag().load(std::memory_order_relaxed); }
void set_fused_swiglu_gemm(bool enabled) { fused_swiglu_gemm_flag().store(enabled, std::memory_order_relaxed); }
bool fused_swiglu_gemm() { return fused_swiglu_gemm_flag().load(std::memory_order_relaxed); }
void set_gemm_tuning(bool enabled) { gemm_tuning_flag().store(enabled, std::memory_order_relaxed); }
bool gemm_tuning() { return gemm_tuning_flag().load(std::memory_order_relaxed); }
void set_flash_wgmma(bool enabled) { flash_wgmma_flag().store(enabled, std::memory_order_relaxed); }
bool flash_wgmma() { return flash_wgmma_flag().load(std::memory_order_relaxed); }

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

namespace {

Backend& primitives_for(Device device) {
  static const bool environment_checked = (detail::check_environment(), true);  // a mistake shows at the first op
  (void)environment_checked;
  if (device.is_cpu()) return cpu_backend();
#ifdef MICROLLM_WITH_CUDA
  return cuda_backend(device.index);
#else
  throw NotSupportedError("backend", str_cat("no backend for ", device,
                                             ": this build of microLLM has no CUDA support (configure with "
                                             "-DMICROLLM_CUDA=ON, e.g. the cuda-release preset)"));
#endif
}

// The wrapper of a device's backend or fusions that traces each kernel (tracing_backend.h), made on first use.
template <typename Wrapper, typename Make>
Wrapper& traced(Device device, const Make& make) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Wrapper>> wrappers;
  std::lock_guard lock(mutex);
  auto& slot = wrappers[device.str()];
  if (!slot) slot = make();
  return *slot;
}

}  // namespace

Backend& backend_for(Device device) {
  Backend& backend = primitives_for(device);
  if (!profile::tracing()) return backend;
  return traced<TracingBackend>(device, [&] { return std::make_unique<TracingBackend>(backend); });
}

Fusions& fusions_for(Device device) {
  Backend& primitives = primitives_for(device);
  Fusions& fusions = fusions_of(device, primitives);
  if (!profile::tracing()) return fusions;
  return traced<TracingFusions>(device, [&] { return std::make_unique<TracingFusions>(primitives, fusions); });
}

}  // namespace microllm
