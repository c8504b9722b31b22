// The MLP's input half as one Hopper GEMM (internal header): out = silu(x @ w_gate^T) * (x @ w_up^T) with SwiGLU
// in the epilogue. Design: gemm_swiglu_sm90.cu; measurements:
// docs/perf/kernels.md#gemm_swiglu_sm90.
#pragma once

#include <cuda_runtime.h>

#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels {

// Whether the kernel can run on `device`: an sm_90 GPU, a build with sm_90a machine code, and
// fused_swiglu_gemm() on (MICROLLM_DISABLE=swiglu-gemm
// turns it off).
bool swiglu_gemm_available(int device);

// Whether swiglu_gemm takes these operands: x [m, k], w [2n, k] = [w_gate; w_up], out [m, n]; one dtype, bf16 or
// f16; k and n multiples of 8 (at least 8); every row of x, w and out 16-byte aligned with a unit inner stride
// (rows::rows_aligned16); and swiglu_gemm_available.
bool swiglu_gemm_takes(const Tensor& x, const Tensor& w, const Tensor& out);

// Whether the kernel beats cuBLASLt's product and the swiglu kernel at this many rows (prefill-sized batches of
// 2,048 rows and more: docs/perf/kernels.md#gemm_swiglu_sm90); rms_norm_linear takes it only then.
bool swiglu_gemm_pays(int64_t rows);

// Launches the product on `stream` (chained in a captured graph); ShapeError where swiglu_gemm_takes says no.
// No allocation, no synchronization: safe inside graph capture.
void swiglu_gemm(const Tensor& x, const Tensor& w, const Tensor& out, cudaStream_t stream);

}  // namespace microllm::cuda_kernels
