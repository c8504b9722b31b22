// Reverse-mode automatic differentiation over the ops layer.
//
// A Variable is a Tensor plus what backward() needs: whether it requires a gradient, the gradient
// accumulated into it (leaves), and the Node that produced it (non-leaves). The differentiable
// functions in autograd/functions.h run an op forward and, when any input requires a gradient and
// grad mode is on, record a Node whose backward calls that op's backward function from ops/.
// backward() walks the recorded graph once in reverse topological order; each Node's saved tensors
// are released as soon as its backward has run.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "microllm/core/tensor.h"

namespace microllm::autograd {

struct Node;
struct VariableImpl;

class Variable {
 public:
  Variable() = default;
  // A leaf. With requires_grad, backward() accumulates into grad().
  explicit Variable(Tensor value, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const;
  // Replaces the value in place of the same shape/dtype/device (optimizers); keeps grad and graph.
  void set_value(Tensor value);
  // The gradient accumulated by backward() (undefined until then). Each backward() sums the leaf's
  // contributions of its pass first and adds that sum into grad() once.
  const Tensor& grad() const;
  void set_grad(Tensor grad);
  void zero_grad();  // drops the gradient (undefined again)

  bool requires_grad() const;
  void set_requires_grad(bool requires_grad);  // leaves only
  bool is_leaf() const;
  // The same value, cut from the graph: no gradient flows through it.
  Variable detach() const;

  // Shorthands for the value's metadata.
  const Shape& shape() const { return value().shape(); }
  int64_t size(int64_t dim) const { return value().size(dim); }
  int dim() const { return value().dim(); }
  DType dtype() const { return value().dtype(); }
  Device device() const { return value().device(); }

  // Back-propagates from this variable. A scalar seeds with 1; otherwise pass grad_output (its shape).
  void backward(const Tensor& grad_output = Tensor()) const;

  // A leaf's post-accumulate hook: during each backward() that reaches this leaf, called once, right after
  // the last gradient of that pass was added into grad() (the leaf is passed in; its grad() may be undefined
  // when no gradient flowed). Data-parallel training starts a gradient bucket's all-reduce from it while
  // backward goes on. An empty function removes the hook.
  using PostAccumulateHook = std::function<void(const Variable& leaf)>;
  void set_post_accumulate_hook(PostAccumulateHook hook);

  // Internal: the autograd machinery.
  const std::shared_ptr<VariableImpl>& impl() const { return impl_; }
  static Variable from_impl(std::shared_ptr<VariableImpl> impl);

 private:
  std::shared_ptr<VariableImpl> impl_;
};

// One recorded op. backward receives the gradient of each output (undefined for outputs that received
// none) and returns the gradient of each input (undefined for inputs that need none).
struct Node {
  using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
  const char* name;
  std::vector<Variable> inputs;  // the inputs that require a gradient (others are stored undefined)
  int num_outputs = 1;
  BackwardFn backward;           // cleared after it ran: releases the saved tensors
};

struct VariableImpl {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_index = 0;           // which output of grad_fn this is
  Variable::PostAccumulateHook post_accumulate_hook;  // leaves only; see Variable::set_post_accumulate_hook
};

// ---- grad mode ----
bool grad_enabled();
// Turns recording off for its scope (inference, optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Records `outputs` as produced by one op from `inputs` when grad mode is on and an input requires a
// gradient; otherwise returns them as plain variables. backward gets one gradient per output and
// must return one per input.
std::vector<Variable> record(const char* name, std::vector<Tensor> outputs, const std::vector<Variable>& inputs,
                             Node::BackwardFn backward);
Variable record(const char* name, Tensor output, const std::vector<Variable>& inputs, Node::BackwardFn backward);

}  // namespace microllm::autograd
