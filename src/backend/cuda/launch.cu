// Host side of common.cuh's chained launches: whether a device may chain them.
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

#include "common.cuh"

namespace microllm::cuda_kernels {

bool chained_launches(int device) {
  static const bool allowed = [] {
    const char* env = std::getenv("MICROLLM_PDL");
    return env == nullptr || std::string(env) != "0";
  }();
  static std::array<std::atomic<int>, 64> major{};  // compute capability major per device; 0: not read yet
  std::atomic<int>& slot = major[static_cast<size_t>(device) & 63];
  int cc = slot.load(std::memory_order_relaxed);
  if (cc == 0) {
    MICROLLM_CUDA_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, device));
    slot.store(cc, std::memory_order_relaxed);
  }
  return allowed && cc >= 9;
}

}  // namespace microllm::cuda_kernels
