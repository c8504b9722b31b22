// The decode GEMV (internal header): out [m, n] = x [m, k] @ w [n, k]^T (+ bias) for m <= 8, the linear
// layers of a decode step, optionally with the RMSNorms before it and the gated activation after it folded in. Design:
// gemv.cu; measurements: docs/perf/kernels.md#gemv.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "microllm/backend/gated_activation.h"
#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels {

// The RMSNorms folded into the GEMV's x: x' = rms_norm(x) * x_weight [k] where x_weight is defined (a sandwich
// block's sublayer output, normalized before its add; else x' = x), h = x' + residual (residual undefined: h = x'),
// then rms_norm(h) * weight [k], both with eps and rms_norm's roundings; h_out (may be undefined) [m, k] contiguous
// receives h.
struct GemvNorm {
  Tensor residual;
  Tensor weight;
  double eps = 0.0;
  Tensor h_out;
  Tensor x_weight;
};

// Runs the product with the weight-streaming GEMV and returns true when it is one the kernel takes: f16/bf16,
// 2-D x [m, k] with 1 <= m <= 8, w [n, k] (the transposed operand of a linear layer), k % 8 == 0, unit inner
// strides, 16-byte aligned rows, out [m, n] contiguous, and decode_gemv() on (MICROLLM_DISABLE=gemv). bias (may be
// null) has out's dtype and bias_stride elements between entries. norm (may be null): the RMSNorm folded in
// (its tensors of x's dtype, 16-byte aligned rows, m * k small enough to stage). gate (geglu only with a norm): w
// is [2n, k] = [w_gate; w_up], no bias, and out [m, n] = act(x w_gate^T) * (x w_up^T) (gated_activation.h). scope
// (may be null: the caller's OpScope covers the call) names an OpScope opened around the launch only, so a declined
// call times nothing. addend (may be null; not with a gate): [m, n] contiguous of out's dtype, added before the
// one rounding (the residual add of matmul's addend). False: nothing was launched, the caller runs the unfused
// ops. Launches only (no allocation, no synchronization): safe inside graph capture.
bool try_decode_gemv(const Tensor& x, const Tensor& w, const void* bias, int64_t bias_stride, const Tensor& out,
                     cudaStream_t stream, const GemvNorm* norm = nullptr,
                     GatedActivation gate = GatedActivation::none, const char* scope = nullptr,
                     const void* addend = nullptr);

}  // namespace microllm::cuda_kernels
