// RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.
//   h = round(x + residual);  y = round(weight * round(h / sqrt(mean(h^2, last dim) + eps)))
// with round() to x's dtype: Hugging Face's order of roundings, so bf16 results match it bit for bit.
// f32 statistics for every storage dtype (f64 for f64). weight has the size of the last dim.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

struct RmsNormResult {
  Tensor out;   // y, x's dtype and shape
  Tensor h;     // x + residual (undefined without a residual)
  Tensor rstd;  // [rows] f32 (f64 for f64 inputs): 1 / sqrt(mean(h^2) + eps), saved for the backward
};

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
// Fused form: returns y, h = x + residual, and rstd in one pass.
RmsNormResult rms_norm_residual(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps);
RmsNormResult rms_norm_with_stats(const Tensor& x, const Tensor& weight, double eps);

struct RmsNormGrads {
  Tensor grad_h;       // gradient of the normalized input (x, and residual in the fused form)
  Tensor grad_weight;  // weight's dtype
};
// h is the normalized input (x, or x + residual); rstd as returned by the forward.
RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd);

}  // namespace microllm
