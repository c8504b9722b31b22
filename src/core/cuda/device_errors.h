// Errors that CUDA kernels find in their data (an embedding id past the vocabulary, a target outside
// [0, V)), reported without a device-side assert (which would kill the CUDA context) and without a
// host round trip per op (internal header).
//
// Each device has one 64-bit word in mapped, pinned host memory. A kernel that meets bad data writes
// (code << 56 | value) there with one aligned store; the host reads the word at every point where it
// waits for the device anyway (a device-to-host copy, a synchronize) and throws IndexError (ValueError for
// sample_not_greedy, a broken promise rather than a bad index) naming the op and the bad value. The first report wins; later ones may overwrite it, which only changes which bad
// value the message names.
#pragma once

#include <cstdint>

namespace microllm::detail {

enum class DeviceErrorCode : uint8_t {
  none = 0,
  embedding_id = 1,      // embedding / embedding_backward: id outside [0, vocab)
  scatter_index = 2,     // scatter_add: index outside [0, size of dim)
  target_index = 3,      // cross_entropy: target outside [0, V) and not ignore_index
  paged_slot = 4,        // paged_kv_write: slot past the pools' num_blocks * block_size slots
  paged_block = 5,       // paged_attention / paged_gather: block id outside [0, num_blocks)
  paged_sequence = 6,    // paged_attention: seq id outside [0, rows of block_tables)
  paged_position = 7,    // paged_attention: position + 1 past max_context or the block table's capacity
  sample_not_greedy = 8, // sample_tokens: greedy_only was promised but this row has temperature > 0
};

// Device-visible address of `device`'s error word (created on first use).
uint64_t* cuda_error_word(int device);
// Throws IndexError (ValueError for sample_not_greedy) if a kernel on `device` reported since the last check,
// and clears the report.
void check_cuda_device_errors(int device);

#if defined(__CUDACC__)
__device__ __forceinline__ void report_device_error(uint64_t* word, DeviceErrorCode code, int64_t value) {
  const uint64_t packed = (static_cast<uint64_t>(code) << 56) | (static_cast<uint64_t>(value) & ((1ull << 56) - 1));
  *reinterpret_cast<volatile uint64_t*>(word) = packed;
}
#endif

}  // namespace microllm::detail
