// rms_norm_linear: checks and dispatch (ops/norm_linear.h).
#include "microllm/ops/norm_linear.h"

#include <cmath>

#include "checks.h"
#include "microllm/backend/fusions.h"

namespace microllm {

NormLinearResult rms_norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                                 const Tensor& weight, const Tensor& bias, GatedActivation gate,
                                 const Tensor& x_norm_weight) {
  const char* op = "rms_norm_linear";
  checks::floating(op, x, "input");
  MICROLLM_CHECK(x.dim() >= 1, ShapeError, op, "input must have rank >= 1, got shape ", x.shape());
  const int64_t k = x.size(-1);
  checks::rank(op, norm_weight, "norm weight", 1);
  MICROLLM_CHECK(norm_weight.size(0) == k, ShapeError, op, "norm weight shape ", norm_weight.shape(),
                 " does not match the last dim of input ", x.shape());
  checks::rank(op, weight, "weight", 2);
  MICROLLM_CHECK(weight.size(1) == k, ShapeError, op, "weight shape ", weight.shape(),
                 " does not match the last dim of input ", x.shape());
  const bool gated = gate != GatedActivation::none;
  MICROLLM_CHECK(!gated || weight.size(0) % 2 == 0, ShapeError, op, "with ", gated_activation_name(gate),
                 " the weight is [w_gate; w_up] and needs an even row count, got ", weight.shape());
  MICROLLM_CHECK(std::isfinite(eps) && eps > 0, ValueError, op, "eps must be a finite number > 0, got ", eps);
  if (x_norm_weight.defined()) {
    checks::rank(op, x_norm_weight, "input norm weight", 1);
    MICROLLM_CHECK(x_norm_weight.size(0) == k, ShapeError, op, "input norm weight shape ", x_norm_weight.shape(),
                   " does not match the last dim of input ", x.shape());
    checks::same_dtype(op, x, "input", x_norm_weight, "input norm weight");
    checks::same_device(op, x, "input", x_norm_weight, "input norm weight");
  }
  for (const auto& [t, name] : {std::pair{&norm_weight, "norm weight"}, {&weight, "weight"}}) {
    checks::same_dtype(op, x, "input", *t, name);
    checks::same_device(op, x, "input", *t, name);
  }
  if (residual.defined()) {
    checks::same_shape(op, x, "input", residual, "residual");
    checks::same_dtype(op, x, "input", residual, "residual");
    checks::same_device(op, x, "input", residual, "residual");
  }
  if (bias.defined()) {
    MICROLLM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, op, "bias shape ", bias.shape(),
                   " does not match weight shape ", weight.shape());
    checks::same_dtype(op, x, "input", bias, "bias");
    checks::same_device(op, x, "input", bias, "bias");
  }
  int64_t rows = 1;
  for (int d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  const int64_t n = gated ? weight.size(0) / 2 : weight.size(0);
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = n;
  NormLinearResult result;
  const Tensor out = Tensor::empty({rows, n}, x.dtype(), x.device());
  const bool new_h = residual.defined() || x_norm_weight.defined();  // else h is x itself
  const Tensor h = new_h ? Tensor::empty({rows, k}, x.dtype(), x.device()) : Tensor();
  fusions_for(x.device())
      .rms_norm_linear(x.reshape({rows, k}), x_norm_weight,
                       residual.defined() ? residual.reshape({rows, k}) : Tensor(), norm_weight, eps, weight, bias,
                       gate, out, h);
  result.out = out.view(out_shape);
  result.h = h.defined() ? h.view(x.shape()) : x;
  return result;
}

bool rms_norm_linear_folds(int64_t rows, const Tensor& weight, GatedActivation gate) {
  return fusions_for(weight.device()).folds_rms_norm_linear(rows, weight, gate);
}

}  // namespace microllm
