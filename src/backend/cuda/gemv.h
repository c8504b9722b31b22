// The decode GEMV (internal header): out [m, n] = x [m, k] @ w [n, k]^T (+ bias) for m <= 8, the linear
// layers of a decode step. Design and measurements: gemv.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels {

// Runs the product with the weight-streaming GEMV and returns true when it is one the kernel takes: f16/bf16,
// 2-D x [m, k] with 1 <= m <= 8, w [n, k] (the transposed operand of a linear layer), k % 8 == 0, unit inner
// strides, 16-byte aligned rows, out [m, n] contiguous, and decode_gemv() on (MICROLLM_GEMV). bias (may be
// null) has out's dtype and bias_stride elements between entries. False: nothing was launched, the caller
// runs cuBLASLt. Launches only (no allocation, no synchronization): safe inside CUDA graph capture.
bool try_decode_gemv(const Tensor& x, const Tensor& w, const void* bias, int64_t bias_stride, const Tensor& out,
                     cudaStream_t stream);

}  // namespace microllm::cuda_kernels
