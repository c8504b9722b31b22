// The two places of a decoder layer where an RMSNorm feeds projections, each as one op, so that a backend can
// fold them into one kernel (CUDA does at decode size, src/backend/cuda/gemv.cu):
//   x' = x, or rms_norm(x, x_norm_weight, eps)    a sandwich block's sublayer output, normalized before its add
//   h = x' + residual (x' without one);  n = rms_norm(h, norm_weight, eps)
//   out = n @ weight^T (+ bias)                                   the attention's qkv projection
//   out = act(n @ w_gate^T) * (n @ w_up^T), weight = [w_gate; w_up]   the MLP's input half (gate: swiglu, geglu)
// The result equals the composition of rms_norm(_residual), linear and the gated activation's ops (ops/norm.h,
// matmul.h, activation.h, elementwise.h) up to the summation order of the products: the same roundings to x's
// dtype in between. Inference only: there is no backward (training composes the separate ops).
#pragma once

#include "microllm/backend/gated_activation.h"
#include "microllm/core/tensor.h"

namespace microllm {

struct NormLinearResult {
  Tensor out;  // [.., N]: weight's rows, or half of them with a gate
  Tensor h;    // x' + residual (x' itself without a residual): the residual stream after the add
};

// x [.., K]; residual x's shape or undefined; norm_weight [K]; weight [N, K] (gated: [2N, K]); bias [rows of
// weight] or undefined; x_norm_weight [K] or undefined. One float dtype and device for all.
NormLinearResult rms_norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                                 const Tensor& weight, const Tensor& bias,
                                 GatedActivation gate = GatedActivation::none, const Tensor& x_norm_weight = Tensor());

// Whether rms_norm_linear over `rows` rows of input with this weight runs as one kernel on weight's device
// (CUDA's decode GEMV folds the RMSNorms, the residual add and the gate): where it does, a residual add belongs
// there; elsewhere in the projection before it (linear_add, ops/matmul.h).
bool rms_norm_linear_folds(int64_t rows, const Tensor& weight, GatedActivation gate);

}  // namespace microllm
