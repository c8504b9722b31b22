// Optimizers over a model's parameters: AdamW (decoupled weight decay) and SGD with momentum, each step one
// multi-tensor kernel call (ops/optim.h) over every parameter that has a gradient. Weight decay applies to
// the parameters whose nn::ParameterInfo.weight_decay is true (not norms, biases or embeddings).
//
//   train::Optimizer opt(model.named_parameters(), {.type = "adamw", .weight_decay = 0.1});
//   loss.backward();
//   Tensor scale = clip_coefficient(train::gradient_norm(params), 1.0);  // stays on the device
//   opt.step(schedule.at(opt.steps()), scale);
//   opt.zero_grad();
//
// Build the optimizer after the model has moved to its device: the state lives beside each parameter.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "microllm/nn/module.h"

namespace microllm::train {

struct OptimizerConfig {
  std::string type = "adamw";                    // "adamw" or "sgd"
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // adamw
  double weight_decay = 0.1;                     // adamw: decoupled; sgd: coupled (L2), as in PyTorch
  double momentum = 0.9, dampening = 0;          // sgd
  bool nesterov = false;                         // sgd
  DType state_dtype = DType::f32;                // moments in f32 or bf16 (stochastic rounding)
};

class Optimizer {
 public:
  Optimizer(std::vector<nn::ParameterInfo> params, OptimizerConfig config);

  // One update with learning rate `lr` from each parameter's gradient times grad_scale (undefined: 1;
  // else a one-element f32 tensor on the parameters' device). Parameters without a gradient are skipped.
  void step(double lr, const Tensor& grad_scale = Tensor());
  void zero_grad();
  int64_t steps() const { return steps_; }  // updates done so far
  const OptimizerConfig& config() const { return config_; }
  const std::vector<nn::ParameterInfo>& parameters() const { return params_; }

  // The state for a checkpoint: "<slot>.<parameter name>" for each state tensor (slots exp_avg and
  // exp_avg_sq for AdamW, momentum_buffer for SGD), and "step" (i64 rank 0).
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores what state() returned, by name; `get` throws when a name is missing. Shapes must match.
  void load_state(const std::function<Tensor(const std::string&)>& get);

 private:
  std::vector<nn::ParameterInfo> params_;
  OptimizerConfig config_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<Tensor>> slots_;  // [slot][parameter]
  int64_t steps_ = 0;
};

// The global L2 norm of the gradients of `params` (those that have one): an f32 rank-0 tensor on their
// device, computed there (the host does not wait for it).
Tensor gradient_norm(const std::vector<nn::ParameterInfo>& params);

}  // namespace microllm::train
