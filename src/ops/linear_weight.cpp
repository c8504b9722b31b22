#include "microllm/ops/linear_weight.h"

#include "checks.h"
#include "microllm/ops/matmul.h"

namespace microllm {

namespace {
constexpr const char* kOp = "linear_weight";
}  // namespace

LinearWeight LinearWeight::dense(Tensor weight, Tensor bias) {
  checks::defined(kOp, weight, "weight");
  checks::rank(kOp, weight, "weight", 2);
  MICROLLM_CHECK(weight.dtype() == DType::f32 || weight.dtype() == DType::bf16 || weight.dtype() == DType::f16 ||
                     weight.dtype() == DType::f64,
                 DTypeError, kOp, "a dense weight is f32, bf16, f16 or f64, got ", weight.dtype());
  if (bias.defined()) {
    MICROLLM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, kOp, "bias of shape ", bias.shape(),
                   " for a weight of shape ", weight.shape());
    MICROLLM_CHECK(bias.dtype() == weight.dtype(), DTypeError, kOp, "bias ", bias.dtype(), " for a weight of ",
                   weight.dtype());
  }
  LinearWeight w;
  w.weight_ = std::move(weight);
  w.bias_ = std::move(bias);
  return w;
}

Tensor LinearWeight::linear(const Tensor& x, const Tensor& addend) const {
  return addend.defined() ? linear_add(x, weight_, bias_, addend) : microllm::linear(x, weight_, bias_);
}

NormLinearResult LinearWeight::norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                           double eps, GatedActivation gate, const Tensor& x_norm_weight) const {
  return rms_norm_linear(x, residual, norm_weight, eps, weight_, bias_, gate, x_norm_weight);
}

bool LinearWeight::folds_norm(int64_t rows, GatedActivation gate) const {
  return rms_norm_linear_folds(rows, weight_, gate);
}

}  // namespace microllm
