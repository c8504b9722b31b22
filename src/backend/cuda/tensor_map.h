// Tensor maps for the Tensor Memory Accelerator (TMA, sm_90) of the Hopper kernels (internal header): the
// descriptor a cp.async.bulk.tensor copy reads to fetch a box of a strided tensor into shared memory.
// NVIDIA-only; a HIP port keeps the portable kernels.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "microllm/core/dtype.h"

namespace microllm::cuda_kernels {

// The map of a tensor of 16-bit elements (bf16 or f16) of `rank` dimensions, innermost first: dims[i] elements
// along dimension i, byte_strides[i - 1] bytes between neighbours along it (dimension 0 is contiguous), read in
// boxes of box[i] elements. The box's rows are 128 bytes (box[0] = 64) and land in shared memory with the
// 128-byte swizzle wgmma reads (attention_wgmma.cuh); elements past a dimension's end read as zeros. Throws
// BackendError naming `op` when the driver refuses the description (e.g. a stride not a multiple of 16 bytes).
CUtensorMap swizzled_map(const char* op, const void* base, DType dtype, int rank, const int64_t* dims,
                         const int64_t* byte_strides, const uint32_t* box);

}  // namespace microllm::cuda_kernels
