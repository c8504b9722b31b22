// The two places of a decoder layer where an RMSNorm feeds projections, each as one op, so that a backend can
// fold them into one kernel (CUDA does at decode size, src/backend/cuda/gemv.cu):
//   h = x + residual (x without one);  n = rms_norm(h, norm_weight, eps)
//   out = n @ weight^T (+ bias)                                   the attention's qkv projection
//   out = silu(n @ w_gate^T) * (n @ w_up^T), weight = [w_gate; w_up]   swiglu = true: the MLP's input half
// The result equals the composition of rms_norm(_residual), linear and swiglu (ops/norm.h, matmul.h,
// activation.h) up to the summation order of the products: the same roundings to x's dtype in between.
// Inference only: there is no backward (training composes the separate ops).
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

struct NormLinearResult {
  Tensor out;  // [.., N]: weight's rows, or half of them with swiglu
  Tensor h;    // x + residual (x itself without a residual): the residual stream after the add
};

// x [.., K]; residual x's shape or undefined; norm_weight [K]; weight [N, K] (swiglu: [2N, K]); bias [rows of
// weight] or undefined. One float dtype and device for all.
NormLinearResult rms_norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                                 const Tensor& weight, const Tensor& bias, bool swiglu);

// Whether rms_norm_linear over `rows` rows of input with this weight runs as one kernel on weight's device
// (CUDA's decode GEMV folds the RMSNorm, the residual add and SwiGLU): where it does, a residual add belongs
// there; elsewhere in the projection before it (linear_add, ops/matmul.h).
bool rms_norm_linear_folds(int64_t rows, const Tensor& weight, bool swiglu);

}  // namespace microllm
