#include "cuda_backend.h"

#include <array>
#include <memory>
#include <mutex>

namespace microllm {

Backend& cuda_backend(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::unique_ptr<CudaBackend>, kMaxDevices> backends;
  static std::mutex mutex;
  MICROLLM_CHECK(device >= 0 && device < cuda_device_count() && device < kMaxDevices, DeviceError, "cuda",
                 "no CUDA device ", device, " (this machine has ", cuda_device_count(), ")");
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = backends[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<CudaBackend>(device);
  return *slot;
}

Fusions& cuda_fusions(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::unique_ptr<CudaFusions>, kMaxDevices> fusions;
  static std::mutex mutex;
  Backend& primitives = cuda_backend(device);  // checks the device
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = fusions[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<CudaFusions>(primitives, device);
  return *slot;
}

}  // namespace microllm
