#include "microllm/train/optimizer.h"

#include <cmath>

#include "microllm/core/memory.h"
#include "microllm/ops/optim.h"

namespace microllm::train {

Optimizer::Optimizer(std::vector<nn::ParameterInfo> params, OptimizerConfig config)
    : params_(std::move(params)), config_(std::move(config)) {
  MICROLLM_CHECK(!params_.empty(), ValueError, "optimizer", "no parameters");
  MICROLLM_CHECK(config_.state_dtype == DType::f32 || config_.state_dtype == DType::bf16, DTypeError, "optimizer",
                 "state dtype must be f32 or bf16, got ", config_.state_dtype);
  MICROLLM_CHECK(config_.weight_decay >= 0, ValueError, "optimizer", "weight_decay must be >= 0, got ",
                 config_.weight_decay);
  if (config_.type == "adamw") {
    MICROLLM_CHECK(
        config_.beta1 >= 0 && config_.beta1 < 1 && config_.beta2 >= 0 && config_.beta2 < 1 && config_.eps > 0,
        ValueError, "optimizer", "invalid AdamW betas (", config_.beta1, ", ", config_.beta2, ") or eps ", config_.eps);
    slot_names_ = {"exp_avg", "exp_avg_sq"};
  } else if (config_.type == "sgd") {
    MICROLLM_CHECK(config_.momentum >= 0, ValueError, "optimizer", "momentum must be >= 0, got ", config_.momentum);
    if (config_.momentum > 0) slot_names_ = {"momentum_buffer"};
  } else {
    throw ValueError("optimizer", str_cat("unknown optimizer '", config_.type, "' (have adamw, sgd)"));
  }
  MemoryCategoryScope memory(MemoryCategory::optimizer_state);
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    std::vector<Tensor> slot;
    for (const nn::ParameterInfo& p : params_) {
      slot.push_back(Tensor::zeros(p.variable->shape(), config_.state_dtype, p.variable->device()));
    }
    slots_.push_back(std::move(slot));
  }
}

void Optimizer::step(double lr, const Tensor& grad_scale) {
  std::vector<Tensor> values, grads;
  std::vector<std::vector<Tensor>> state(slots_.size());
  std::vector<double> decay;
  for (size_t i = 0; i < params_.size(); ++i) {
    const nn::ParameterInfo& p = params_[i];
    if (!p.variable->grad().defined()) continue;
    values.push_back(p.variable->value());
    grads.push_back(p.variable->grad());
    for (size_t s = 0; s < slots_.size(); ++s) state[s].push_back(slots_[s][i]);
    decay.push_back(p.weight_decay ? config_.weight_decay : 0.0);
  }
  ++steps_;
  if (values.empty()) return;
  const double t = static_cast<double>(steps_);
  if (config_.type == "adamw") {
    AdamWStep step;
    step.lr = lr;
    step.beta1 = config_.beta1, step.beta2 = config_.beta2, step.eps = config_.eps;
    step.bias_correction1 = 1 - std::pow(config_.beta1, t);
    step.bias_correction2 = 1 - std::pow(config_.beta2, t);
    step.step = steps_;
    adamw_step(values, grads, state[0], state[1], decay, grad_scale, step);
  } else {
    SgdStep step;
    step.lr = lr;
    step.momentum = config_.momentum, step.dampening = config_.dampening, step.nesterov = config_.nesterov;
    step.first_step = steps_ == 1;
    step.step = steps_;
    sgd_step(values, grads, config_.momentum > 0 ? state[0] : std::vector<Tensor>{}, decay, grad_scale, step);
  }
}

void Optimizer::zero_grad() {
  for (const nn::ParameterInfo& p : params_) p.variable->zero_grad();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(slot_names_[s] + "." + params_[i].name, slots_[s][i]);
  }
  out.emplace_back("step", Tensor::scalar(static_cast<double>(steps_), DType::i64));
  return out;
}

void Optimizer::load_state(const std::function<Tensor(const std::string&)>& get) {
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string name = slot_names_[s] + "." + params_[i].name;
      const Tensor value = get(name);
      MICROLLM_CHECK(value.shape() == slots_[s][i].shape(), ShapeError, "optimizer", name, " has shape ", value.shape(),
                     " but the parameter has shape ", slots_[s][i].shape());
      slots_[s][i].copy_(value);  // converts to the configured state dtype and device
    }
  }
  const Tensor step = get("step");
  steps_ = step.to(DType::i64).item<int64_t>();
  MICROLLM_CHECK(steps_ >= 0, ValueError, "optimizer", "negative step ", steps_, " in the state");
}

Tensor gradient_norm(const std::vector<nn::ParameterInfo>& params) {
  std::vector<Tensor> grads;
  for (const nn::ParameterInfo& p : params) {
    if (p.variable->grad().defined()) grads.push_back(p.variable->grad());
  }
  MICROLLM_CHECK(!grads.empty(), ValueError, "gradient_norm", "no parameter has a gradient");
  return global_norm(grads);
}

}  // namespace microllm::train
