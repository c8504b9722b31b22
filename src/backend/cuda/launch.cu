// Host side of common.cuh's launch helpers: device attributes read once per device, and whether a device
// may chain launches.
#include <array>
#include <atomic>

#include "../environment.h"
#include "common.cuh"

namespace microllm::cuda_kernels {
namespace {

constexpr int kMaxDevices = 64;

// Attribute `attribute` of `device`, read on the first call (launch paths ask on every call).
template <cudaDeviceAttr attribute>
int cached_attribute(int device) {
  static std::array<std::atomic<int>, kMaxDevices> values{};  // 0: not read yet
  MICROLLM_CHECK(device >= 0 && device < kMaxDevices, DeviceError, "cuda", "device index ", device, " out of range");
  std::atomic<int>& slot = values[static_cast<size_t>(device)];
  int value = slot.load(std::memory_order_relaxed);
  if (value == 0) {
    MICROLLM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
    slot.store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int multiprocessor_count(int device) { return cached_attribute<cudaDevAttrMultiProcessorCount>(device); }

int compute_capability(int device) {
  return 10 * cached_attribute<cudaDevAttrComputeCapabilityMajor>(device) +
         cached_attribute<cudaDevAttrComputeCapabilityMinor>(device);
}

int max_shared_memory_optin(int device) { return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device); }

bool chained_launches(int device) {
  static const bool allowed = !detail::path_disabled(detail::FastPath::pdl);
  return allowed && cached_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

}  // namespace microllm::cuda_kernels
