// RMSNorm (plain and fused with the residual add): checks, output allocation, dispatch, backward.
//   h = x (+ residual);  rstd = 1 / sqrt(mean(h^2, last dim) + eps);  y = weight * (h * rstd)
// rstd is kept in the accumulation type of the kernels: f32, or f64 for f64 input. An f32 rstd would make
// the f64 backward lossy, and the backward cannot recompute rstd because it is not given eps.
#include "microllm/ops/norm.h"

#include <cmath>

#include "checks.h"

namespace microllm {
namespace {

DType stats_dtype(DType input) { return input == DType::f64 ? DType::f64 : DType::f32; }

// Rows of a [..., n] tensor: the product of all dims but the last (defined even when n is 0).
int64_t row_count(const Tensor& t) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// weight is 1-D with the size of input's last dim, input's dtype and device.
void check_weight(const char* op, const Tensor& input, const char* input_name, const Tensor& weight) {
  checks::defined(op, weight, "weight");
  checks::same_dtype(op, input, input_name, weight, "weight");
  checks::same_device(op, input, input_name, weight, "weight");
  MICROLLM_CHECK(weight.dim() == 1 && weight.size(0) == input.size(-1), ShapeError, op, "weight shape ", weight.shape(),
                 " does not match the last dim of ", input_name, " ", input.shape());
}

RmsNormResult forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  checks::floating(op, x, "input");
  MICROLLM_CHECK(x.dim() >= 1, ShapeError, op, "input must have rank >= 1, got shape ", x.shape());
  check_weight(op, x, "input", weight);
  MICROLLM_CHECK(std::isfinite(eps) && eps > 0, ValueError, op, "eps must be a finite number > 0, got ", eps);
  if (residual.defined()) {
    checks::same_shape(op, x, "input", residual, "residual");
    checks::same_dtype(op, x, "input", residual, "residual");
    checks::same_device(op, x, "input", residual, "residual");
  }
  RmsNormResult result;
  result.out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (residual.defined()) result.h = Tensor::empty(x.shape(), x.dtype(), x.device());
  result.rstd = Tensor::empty({row_count(x)}, stats_dtype(x.dtype()), x.device());
  backend_for(x.device()).rms_norm(x, residual, weight, eps, result.out, result.h, result.rstd);
  return result;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) { return forward(x, Tensor(), weight, eps).out; }

RmsNormResult rms_norm_with_stats(const Tensor& x, const Tensor& weight, double eps) {
  return forward(x, Tensor(), weight, eps);
}

RmsNormResult rms_norm_residual(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  checks::defined("rms_norm", residual, "residual");
  return forward(x, residual, weight, eps);
}

// grad_h = rstd * (w g - h * rstd^2 * mean(w g h)) per row; grad_w = sum over rows of g * h * rstd.
// In the fused form grad_h is the gradient of both x and residual (d h / d x = d h / d residual = 1).
RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rms_norm_backward";
  checks::floating(op, h, "h");
  MICROLLM_CHECK(h.dim() >= 1, ShapeError, op, "h must have rank >= 1, got shape ", h.shape());
  checks::defined(op, grad_out, "grad_out");
  checks::same_shape(op, h, "h", grad_out, "grad_out");
  checks::same_dtype(op, h, "h", grad_out, "grad_out");
  checks::same_device(op, h, "h", grad_out, "grad_out");
  check_weight(op, h, "h", weight);
  checks::defined(op, rstd, "rstd");
  checks::same_device(op, h, "h", rstd, "rstd");
  const DType want = stats_dtype(h.dtype());
  MICROLLM_CHECK(rstd.dtype() == want, DTypeError, op, "rstd must be ", want, " for h of dtype ", h.dtype(), ", got ",
                 rstd.dtype());
  MICROLLM_CHECK(rstd.dim() == 1 && rstd.size(0) == row_count(h), ShapeError, op, "rstd shape ", rstd.shape(),
                 " does not match the ", row_count(h), " rows of h ", h.shape());
  RmsNormGrads grads;
  grads.grad_h = Tensor::empty(h.shape(), h.dtype(), h.device());
  grads.grad_weight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
  backend_for(h.device()).rms_norm_backward(grad_out, h, weight, rstd, grads.grad_h, grads.grad_weight);
  return grads;
}

}  // namespace microllm
