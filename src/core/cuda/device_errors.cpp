#include "device_errors.h"

#include <mutex>

#include "cuda_check.h"

namespace microllm::detail {
namespace {

struct ErrorWord {
  uint64_t* host = nullptr;    // mapped pinned memory
  uint64_t* device = nullptr;  // the same memory as the device sees it
};

ErrorWord& error_word(int device) {
  static std::mutex mutex;
  static ErrorWord words[64];
  MICROLLM_CHECK(device >= 0 && device < 64, DeviceError, "cuda", "device index ", device, " out of range");
  std::lock_guard<std::mutex> lock(mutex);
  ErrorWord& w = words[device];
  if (!w.host) {
    CudaDeviceGuard guard(device);
    void* host = nullptr;
    MICROLLM_CUDA_CHECK(cudaHostAlloc(&host, sizeof(uint64_t), cudaHostAllocMapped));
    *static_cast<uint64_t*>(host) = 0;
    void* dev = nullptr;
    MICROLLM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    w.host = static_cast<uint64_t*>(host);
    w.device = static_cast<uint64_t*>(dev);
  }
  return w;
}

const char* op_of(DeviceErrorCode code) {
  switch (code) {
    case DeviceErrorCode::embedding_id: return "embedding";
    case DeviceErrorCode::scatter_index: return "scatter_add";
    case DeviceErrorCode::target_index: return "cross_entropy";
    case DeviceErrorCode::paged_slot: return "paged_kv_write";
    case DeviceErrorCode::paged_block: return "paged_attention";
    case DeviceErrorCode::paged_sequence: return "paged_attention";
    case DeviceErrorCode::paged_position: return "paged_attention";
    case DeviceErrorCode::sample_not_greedy: return "sample_tokens";
    default: return "cuda";
  }
}

const char* what_of(DeviceErrorCode code) {
  switch (code) {
    case DeviceErrorCode::embedding_id: return "an id outside [0, vocab)";
    case DeviceErrorCode::scatter_index: return "an index outside the scattered dim";
    case DeviceErrorCode::target_index: return "a target outside [0, V) that is not ignore_index";
    case DeviceErrorCode::paged_slot: return "a slot past the pools' num_blocks * block_size";
    case DeviceErrorCode::paged_block: return "a block id outside [0, num_blocks) (paged_attention or paged_gather)";
    case DeviceErrorCode::paged_sequence: return "a seq id outside the rows of block_tables";
    case DeviceErrorCode::paged_position: return "a position + 1 past max_context or the block table's capacity";
    case DeviceErrorCode::sample_not_greedy:
      return "a row with temperature > 0 in a call whose SamplerRows::greedy_only promised greedy rows (it got the "
             "greedy id); row";
    default: return "bad data";
  }
}

}  // namespace

uint64_t* cuda_error_word(int device) { return error_word(device).device; }

void check_cuda_device_errors(int device) {
  ErrorWord& w = error_word(device);
  const uint64_t report = *reinterpret_cast<volatile uint64_t*>(w.host);
  if (report == 0) return;
  *reinterpret_cast<volatile uint64_t*>(w.host) = 0;
  const auto code = static_cast<DeviceErrorCode>(report >> 56);
  int64_t value = static_cast<int64_t>(report & ((1ull << 56) - 1));
  if (value & (1ll << 55)) value -= (1ll << 56);  // sign-extend the 56-bit field
  const std::string message = str_cat("a CUDA kernel on cuda:", device, " met ", what_of(code), ": ", value);
  // A broken caller promise is a bad value, not a bad index: the one code that is not an IndexError.
  if (code == DeviceErrorCode::sample_not_greedy) throw ValueError(op_of(code), message);
  throw IndexError(op_of(code), message);
}

}  // namespace microllm::detail
