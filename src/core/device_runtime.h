// What core needs from a device besides the CPU (internal header). Implemented for CUDA in
// src/core/cuda/, and by src/core/no_cuda.cpp (throwing NotSupportedError) in CPU-only builds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "microllm/core/storage.h"

namespace microllm {
class Tensor;
}

namespace microllm::detail {

int cuda_device_count_impl();
Allocator& cuda_allocator(int device);
// Copies bytes where at least one side is a CUDA device. Returns after the bytes have arrived.
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
void cuda_fill_bytes(void* dst, int device, int byte, size_t nbytes);
// Sets every element of a contiguous CUDA tensor to `value` (converted to its dtype) on the device.
void cuda_fill(const Tensor& dst, double value);
// dst[i] = convert(src[i]) for tensors on the same CUDA device; src is already expanded to dst's shape.
void cuda_copy_strided(const Tensor& src, const Tensor& dst);

// Allocations on this thread come from graph pool `pool` while the scope lives (cuda::Graph::capture).
class GraphPoolScope {
 public:
  explicit GraphPoolScope(uint64_t pool);
  ~GraphPoolScope();
  GraphPoolScope(const GraphPoolScope&) = delete;
  GraphPoolScope& operator=(const GraphPoolScope&) = delete;

 private:
  uint64_t previous_;
};

}  // namespace microllm::detail
