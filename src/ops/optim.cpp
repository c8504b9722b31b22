// Optimizer ops: checks and dispatch of the multi-tensor kernels, and the global norm composed from them.
#include "microllm/ops/optim.h"

#include <cmath>

#include "checks.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/reduce.h"

namespace microllm {
namespace {

void same_count(const char* op, size_t expected, size_t got, const char* what) {
  MICROLLM_CHECK(expected == got, ValueError, op, "got ", got, " ", what, " for ", expected, " parameters");
}

// Parameters are f32, contiguous, on one device.
Device check_params(const char* op, const std::vector<Tensor>& params) {
  MICROLLM_CHECK(!params.empty(), ValueError, op, "no parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    checks::defined(op, p, "param");
    MICROLLM_CHECK(p.dtype() == DType::f32, DTypeError, op, "param ", i, " must be f32 (the master weights), got ",
                   p.dtype());
    MICROLLM_CHECK(p.is_contiguous(), ValueError, op, "param ", i, " must be contiguous: it is updated in place");
    checks::same_device(op, params[0], "param 0", p, "param");
  }
  return params[0].device();
}

// Gradients: f32 of each parameter's shape on its device; non-contiguous ones are copied.
std::vector<Tensor> check_grads(const char* op, const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  same_count(op, params.size(), grads.size(), "gradients");
  std::vector<Tensor> out;
  out.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    checks::defined(op, grads[i], "grad");
    MICROLLM_CHECK(grads[i].dtype() == DType::f32, DTypeError, op, "grad ", i, " must be f32, got ", grads[i].dtype());
    checks::same_shape(op, params[i], "param", grads[i], "grad");
    checks::same_device(op, params[i], "param", grads[i], "grad");
    out.push_back(grads[i].contiguous());
  }
  return out;
}

// Moments: f32 or bf16 (one dtype for the list), contiguous, of each parameter's shape.
void check_moments(const char* op, const std::vector<Tensor>& params, const std::vector<Tensor>& moments,
                   const char* what) {
  same_count(op, params.size(), moments.size(), what);
  for (size_t i = 0; i < moments.size(); ++i) {
    const Tensor& m = moments[i];
    checks::defined(op, m, what);
    MICROLLM_CHECK(m.dtype() == DType::f32 || m.dtype() == DType::bf16, DTypeError, op, what, " ", i,
                   " must be f32 or bf16, got ", m.dtype());
    checks::same_dtype(op, moments[0], what, m, what);
    checks::same_shape(op, params[i], "param", m, what);
    checks::same_device(op, params[i], "param", m, what);
    MICROLLM_CHECK(m.is_contiguous(), ValueError, op, what, " ", i, " must be contiguous: it is updated in place");
    MICROLLM_CHECK(!m.shares_storage_with(params[i]), ValueError, op, what, " ", i, " shares storage with its param");
  }
}

void check_scale(const char* op, const Tensor& grad_scale, Device device) {
  if (!grad_scale.defined()) return;
  MICROLLM_CHECK(grad_scale.dtype() == DType::f32 && grad_scale.numel() == 1, ValueError, op,
                 "grad_scale must be a one-element f32 tensor, got ", grad_scale.dtype(), " ", grad_scale.shape());
  MICROLLM_CHECK(grad_scale.device() == device, DeviceError, op, "grad_scale is on ", grad_scale.device(),
                 " but the parameters are on ", device);
}

void check_decay(const char* op, const std::vector<Tensor>& params, const std::vector<double>& weight_decay) {
  same_count(op, params.size(), weight_decay.size(), "weight decays");
  for (double wd : weight_decay) {
    MICROLLM_CHECK(std::isfinite(wd) && wd >= 0, ValueError, op, "weight decay must be finite and >= 0, got ", wd);
  }
}

}  // namespace

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const std::vector<double>& weight_decay,
                const Tensor& grad_scale, const AdamWStep& step) {
  const char* op = "adamw_step";
  const Device device = check_params(op, params);
  const std::vector<Tensor> g = check_grads(op, params, grads);
  check_moments(op, params, exp_avg, "exp_avg");
  check_moments(op, params, exp_avg_sq, "exp_avg_sq");
  checks::same_dtype(op, exp_avg[0], "exp_avg", exp_avg_sq[0], "exp_avg_sq");
  check_decay(op, params, weight_decay);
  check_scale(op, grad_scale, device);
  MICROLLM_CHECK(step.lr >= 0 && step.beta1 >= 0 && step.beta1 < 1 && step.beta2 >= 0 && step.beta2 < 1 &&
                     step.eps > 0 && step.bias_correction1 > 0 && step.bias_correction2 > 0,
                 ValueError, op, "invalid hyperparameters: lr ", step.lr, " betas (", step.beta1, ", ", step.beta2,
                 ") eps ", step.eps, " bias corrections (", step.bias_correction1, ", ", step.bias_correction2, ")");
  backend_for(device).adamw_step(params, g, exp_avg, exp_avg_sq, weight_decay, grad_scale, step);
}

void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
              const Tensor& grad_scale, const SgdStep& step) {
  const char* op = "sgd_step";
  const Device device = check_params(op, params);
  const std::vector<Tensor> g = check_grads(op, params, grads);
  MICROLLM_CHECK(step.momentum >= 0 && step.lr >= 0, ValueError, op, "invalid lr ", step.lr, " or momentum ",
                 step.momentum);
  MICROLLM_CHECK(!step.nesterov || (step.momentum > 0 && step.dampening == 0), ValueError, op,
                 "nesterov needs momentum > 0 and no dampening");
  if (step.momentum > 0) {
    check_moments(op, params, momentum_buffer, "momentum_buffer");
  } else {
    MICROLLM_CHECK(momentum_buffer.empty(), ValueError, op, "momentum buffers given without momentum");
  }
  check_decay(op, params, weight_decay);
  check_scale(op, grad_scale, device);
  backend_for(device).sgd_step(params, g, momentum_buffer, weight_decay, grad_scale, step);
}

Tensor sum_squares(const std::vector<Tensor>& tensors) {
  const char* op = "sum_squares";
  MICROLLM_CHECK(!tensors.empty(), ValueError, op, "no tensors");
  std::vector<Tensor> xs;
  xs.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    checks::floating(op, t, "tensor");
    checks::same_device(op, tensors[0], "tensor 0", t, "tensor");
    xs.push_back(t.contiguous());
  }
  Tensor out = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::f32, tensors[0].device());
  backend_for(out.device()).sum_squares(xs, out);
  return out;
}

Tensor global_norm(const std::vector<Tensor>& tensors) { return sqrt(sum(sum_squares(tensors))); }

Tensor clip_coefficient(const Tensor& norm, double max_norm) {
  const char* op = "clip_coefficient";
  checks::defined(op, norm, "norm");
  MICROLLM_CHECK(norm.dtype() == DType::f32 && norm.numel() == 1, ValueError, op,
                 "norm must be a one-element f32 tensor, got ", norm.dtype(), " ", norm.shape());
  MICROLLM_CHECK(max_norm > 0 && std::isfinite(max_norm), ValueError, op, "max_norm must be > 0, got ", max_norm);
  const Device device = norm.device();
  const Tensor denominator = add(norm.reshape({}), Tensor::scalar(1e-6, DType::f32, device));
  return minimum(div(Tensor::scalar(max_norm, DType::f32, device), denominator), Tensor::scalar(1, DType::f32, device));
}

}  // namespace microllm
