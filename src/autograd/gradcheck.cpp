#include "microllm/autograd/gradcheck.h"

#include <cmath>

#include "microllm/autograd/functions.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/reduce.h"

namespace microllm::autograd {

GradcheckResult gradcheck(const std::function<Variable(const std::vector<Variable>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps, double tolerance, uint64_t seed) {
  GradcheckResult result;
  std::vector<Tensor> base;
  for (const Tensor& t : inputs) {
    MICROLLM_CHECK(t.device().is_cpu() && (t.dtype() == DType::f64 || is_integral(t.dtype())), DTypeError,
                   "gradcheck", "inputs must be f64 (or integer) CPU tensors, got ", t.dtype(), " on ", t.device());
    base.push_back(t.clone());
  }
  auto variables = [&](const std::vector<Tensor>& values, bool with_grad) {
    std::vector<Variable> vars;
    for (const Tensor& t : values) vars.emplace_back(t, with_grad && is_floating(t.dtype()));
    return vars;
  };
  // The probe R, and L(values) = sum(fn(values) * R) without recording.
  Generator gen(seed);
  Tensor probe;
  auto loss = [&](const std::vector<Tensor>& values) {
    NoGradGuard no_grad;
    const Tensor out = fn(variables(values, false)).value();
    if (!probe.defined()) probe = Tensor::uniform(out.shape(), gen, -1, 1, DType::f64);
    return microllm::sum(microllm::mul(out, probe)).item<double>();
  };
  loss(base);  // fixes R's shape
  std::vector<Variable> vars = variables(base, true);
  const Variable out = fn(vars);
  MICROLLM_CHECK(out.dtype() == DType::f64, DTypeError, "gradcheck", "fn must return f64, got ", out.dtype());
  if (!out.requires_grad()) {
    result.ok = false;
    result.message = "the output does not depend on any input through a differentiable path";
    return result;
  }
  out.backward(probe);
  for (size_t k = 0; k < base.size(); ++k) {
    if (!is_floating(base[k].dtype())) continue;
    const Tensor analytic = vars[k].grad();
    const std::vector<double> a = analytic.defined() ? analytic.to_vector<double>()
                                                     : std::vector<double>(static_cast<size_t>(base[k].numel()), 0.0);
    for (int64_t i = 0; i < base[k].numel(); ++i) {
      std::vector<Tensor> plus = base, minus = base;
      plus[k] = base[k].clone();
      minus[k] = base[k].clone();
      plus[k].data<double>()[i] += eps;
      minus[k].data<double>()[i] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      const double error = std::abs(numeric - a[static_cast<size_t>(i)]) / (1 + std::abs(numeric));
      if (!(error <= result.max_error)) {  // NaN counts as worst
        result.max_error = std::isnan(error) ? INFINITY : error;
        result.worst_input = static_cast<int>(k);
        result.worst_element = i;
      }
    }
  }
  result.ok = result.max_error <= tolerance;
  if (!result.ok) {
    result.message = str_cat("input ", result.worst_input, " element ", result.worst_element, ": relative error ",
                             result.max_error, " > ", tolerance);
  }
  return result;
}

}  // namespace microllm::autograd
