// The per-device cuBLASLt handle and the per-stream workspaces. Both are leaked on purpose: they must
// outlive every op, and destroying them at exit would race the CUDA runtime's own teardown.
#include "cublaslt.h"

#include <array>
#include <map>
#include <mutex>
#include <utility>

#include "../../core/cuda/cuda_check.h"
#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels {
namespace {

constexpr int kMaxDevices = 64;

struct LtState {
  std::mutex mutex;
  std::array<cublasLtHandle_t, kMaxDevices> handles{};
  std::map<std::pair<int, cudaStream_t>, Tensor> workspaces;
};

LtState& state() {
  static LtState* s = new LtState();
  return *s;
}

void check_device_index(int device) {
  MICROLLM_CHECK(device >= 0 && device < kMaxDevices, DeviceError, "cublasLt", "device index ", device,
                 " out of range");
}

}  // namespace

cublasLtHandle_t cublaslt_handle(int device) {
  check_device_index(device);
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  cublasLtHandle_t& handle = s.handles[static_cast<size_t>(device)];
  if (!handle) MICROLLM_CUBLAS_CHECK(cublasLtCreate(&handle));
  return handle;
}

CublasLtWorkspace cublaslt_workspace(int device, cudaStream_t stream) {
  check_device_index(device);
  // The allocator files a block under the thread's current stream; the workspace must be that stream's.
  MICROLLM_CHECK(stream == detail::current_cuda_stream(device), BackendError, "cublasLt",
                 "the workspace is taken for the current stream only");
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.workspaces.find({device, stream});
  if (it == s.workspaces.end()) {
    MemoryCategoryScope memory(MemoryCategory::workspace);
    Tensor buffer = Tensor::empty({static_cast<int64_t>(kCublasLtWorkspaceBytes)}, DType::u8, Device::cuda(device));
    it = s.workspaces.emplace(std::pair{device, stream}, std::move(buffer)).first;
  }
  return {it->second.data_ptr(), kCublasLtWorkspaceBytes};
}

}  // namespace microllm::cuda_kernels
