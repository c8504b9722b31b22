// Variables, grad mode, recording, and the backward pass.
#include "microllm/autograd/variable.h"

#include <unordered_map>
#include <unordered_set>

#include "microllm/ops/elementwise.h"

namespace microllm::autograd {
namespace {

thread_local bool t_grad_enabled = true;

const std::shared_ptr<VariableImpl>& checked(const std::shared_ptr<VariableImpl>& impl, const char* what) {
  MICROLLM_CHECK(impl != nullptr, ValueError, "autograd", what, " of an undefined variable");
  return impl;
}

// Nodes reachable from `root`, each after every node that consumes its outputs. The list owns them:
// the backward pass releases each node's inputs as it goes, which may drop the last other reference.
std::vector<std::shared_ptr<Node>> topological_order(const std::shared_ptr<Node>& root) {
  std::vector<std::shared_ptr<Node>> post_order;
  std::unordered_set<Node*> visited{root.get()};
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack{{root, 0}};  // iterative: deep graphs are fine
  while (!stack.empty()) {
    auto& [node, next_input] = stack.back();
    if (next_input < node->inputs.size()) {
      const Variable& input = node->inputs[next_input++];
      if (!input.defined()) continue;
      const std::shared_ptr<Node>& producer = input.impl()->grad_fn;
      if (producer && visited.insert(producer.get()).second) stack.emplace_back(producer, 0);
      continue;
    }
    post_order.push_back(node);
    stack.pop_back();
  }
  return {post_order.rbegin(), post_order.rend()};
}

void accumulate(Tensor& sum, const Tensor& grad) { sum = sum.defined() ? add(sum, grad) : grad; }

// Runs one node's backward on the gradients pending for it (none reached it: nothing to do), adding its
// input gradients into the leaves' sums for this pass and the producers' pending slots.
void run_node(std::unordered_map<Node*, std::vector<Tensor>>& pending,
              std::unordered_map<VariableImpl*, Tensor>& leaf_sums, Node* node) {
  auto it = pending.find(node);
  if (it == pending.end()) return;  // no gradient reached this node
  const std::vector<Tensor> grad_outputs = std::move(it->second);
  pending.erase(it);
  MICROLLM_CHECK(node->backward != nullptr, ValueError, "backward", "the graph through ", node->name,
                 " was already used by a backward pass (its saved tensors are released)");
  const std::vector<Tensor> grad_inputs = node->backward(grad_outputs);
  node->backward = nullptr;  // releases the tensors the op saved
  MICROLLM_CHECK(grad_inputs.size() == node->inputs.size(), ValueError, "backward", node->name, " returned ",
                 grad_inputs.size(), " gradients for ", node->inputs.size(), " inputs");
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    const Variable& input = node->inputs[i];
    const Tensor& g = grad_inputs[i];
    if (!input.defined() || !g.defined()) continue;
    MICROLLM_CHECK(g.shape() == input.shape(), ShapeError, "backward", node->name, " gave input ", i,
                   " a gradient of shape ", g.shape(), " for a value of shape ", input.shape());
    VariableImpl& target = *input.impl();
    if (!target.grad_fn) {
      accumulate(leaf_sums[&target], g);
    } else {
      auto& slots = pending[target.grad_fn.get()];
      slots.resize(static_cast<size_t>(target.grad_fn->num_outputs));
      accumulate(slots[static_cast<size_t>(target.output_index)], g);
    }
  }
  node->inputs.clear();  // the intermediate values this node kept alive can go too
}

}  // namespace

Variable::Variable(Tensor value, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  MICROLLM_CHECK(value.defined(), ValueError, "autograd", "a variable needs a defined tensor");
  MICROLLM_CHECK(!requires_grad || is_floating(value.dtype()), DTypeError, "autograd",
                 "only floating tensors can require a gradient, got ", value.dtype());
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
}

Variable Variable::from_impl(std::shared_ptr<VariableImpl> impl) {
  Variable v;
  v.impl_ = std::move(impl);
  return v;
}

const Tensor& Variable::value() const { return checked(impl_, "value")->value; }

void Variable::set_value(Tensor value) {
  const Tensor& old = checked(impl_, "set_value")->value;
  MICROLLM_CHECK(value.shape() == old.shape() && value.dtype() == old.dtype() && value.device() == old.device(),
                 ValueError, "autograd", "set_value: new value ", value.shape(), " ", value.dtype(), " ", value.device(),
                 " differs from ", old.shape(), " ", old.dtype(), " ", old.device());
  impl_->value = std::move(value);
}

const Tensor& Variable::grad() const { return checked(impl_, "grad")->grad; }
void Variable::set_grad(Tensor grad) { checked(impl_, "set_grad")->grad = std::move(grad); }
void Variable::zero_grad() { checked(impl_, "zero_grad")->grad = Tensor(); }
bool Variable::requires_grad() const { return impl_ && impl_->requires_grad; }
bool Variable::is_leaf() const { return checked(impl_, "is_leaf")->grad_fn == nullptr; }

void Variable::set_requires_grad(bool requires_grad) {
  MICROLLM_CHECK(is_leaf(), ValueError, "autograd", "requires_grad can only be set on a leaf variable");
  MICROLLM_CHECK(!requires_grad || is_floating(value().dtype()), DTypeError, "autograd",
                 "only floating tensors can require a gradient, got ", value().dtype());
  impl_->requires_grad = requires_grad;
}

Variable Variable::detach() const { return Variable(value(), false); }

void Variable::set_post_accumulate_hook(PostAccumulateHook hook) {
  MICROLLM_CHECK(is_leaf(), ValueError, "autograd", "a post-accumulate hook can only be set on a leaf variable");
  impl_->post_accumulate_hook = std::move(hook);
}

void Variable::backward(const Tensor& grad_output) const {
  checked(impl_, "backward");
  MICROLLM_CHECK(impl_->requires_grad, ValueError, "backward", "the variable does not require a gradient");
  Tensor seed = grad_output;
  if (!seed.defined()) {
    MICROLLM_CHECK(value().numel() == 1, ShapeError, "backward", "an implicit gradient needs a one-element output, got ",
                   value().shape(), "; pass grad_output");
    seed = Tensor::ones(value().shape(), value().dtype(), value().device());
  }
  MICROLLM_CHECK(seed.shape() == value().shape(), ShapeError, "backward", "grad_output shape ", seed.shape(),
                 " does not match the output shape ", value().shape());
  if (!impl_->grad_fn) {
    accumulate(impl_->grad, seed);
    if (impl_->post_accumulate_hook) impl_->post_accumulate_hook(*this);
    return;
  }
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  pending[impl_->grad_fn.get()].resize(static_cast<size_t>(impl_->grad_fn->num_outputs));
  pending[impl_->grad_fn.get()][static_cast<size_t>(impl_->output_index)] = seed;
  const std::vector<std::shared_ptr<Node>> order = topological_order(impl_->grad_fn);
  // Leaves, listed under the last node (in this order) that feeds them: once that node has run, no more
  // gradient reaches the leaf in this pass. A leaf's contributions of one pass are summed first and added
  // into grad() once, there (as PyTorch's AccumulateGrad does): so accumulating over micro-batches,
  // grad = pass 1 + pass 2 + ..., adds the same per-pass sums in the same order as data parallelism does
  // when it sums the ranks' gradients (a tied embedding gets two contributions per pass).
  std::vector<std::vector<Variable>> leaves_after(order.size());
  {
    std::unordered_map<VariableImpl*, size_t> last_use;
    for (size_t n = 0; n < order.size(); ++n) {
      for (const Variable& input : order[n]->inputs) {
        if (input.defined() && !input.impl()->grad_fn) last_use[input.impl().get()] = n;
      }
    }
    for (size_t n = 0; n < order.size(); ++n) {
      for (const Variable& input : order[n]->inputs) {
        auto it = input.defined() ? last_use.find(input.impl().get()) : last_use.end();
        if (it != last_use.end() && it->second == n) {
          leaves_after[n].push_back(input);
          last_use.erase(it);  // a leaf used twice by one node is listed once
        }
      }
    }
  }
  std::unordered_map<VariableImpl*, Tensor> leaf_sums;  // this pass's gradient of each leaf reached so far
  for (size_t n = 0; n < order.size(); ++n) {
    Node* node = order[n].get();
    run_node(pending, leaf_sums, node);
    for (const Variable& leaf : leaves_after[n]) {
      VariableImpl& target = *leaf.impl();
      auto it = leaf_sums.find(&target);
      if (it != leaf_sums.end()) {
        accumulate(target.grad, it->second);
        leaf_sums.erase(it);
      }
      if (target.post_accumulate_hook) target.post_accumulate_hook(leaf);
    }
  }
}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

std::vector<Variable> record(const char* name, std::vector<Tensor> outputs, const std::vector<Variable>& inputs,
                             Node::BackwardFn backward) {
  bool needs_grad = false;
  for (const Variable& v : inputs) needs_grad = needs_grad || v.requires_grad();
  std::vector<Variable> result;
  if (!needs_grad || !t_grad_enabled) {
    for (Tensor& t : outputs) result.emplace_back(std::move(t), false);
    return result;
  }
  auto node = std::make_shared<Node>();
  node->name = name;
  node->num_outputs = static_cast<int>(outputs.size());
  node->backward = std::move(backward);
  for (const Variable& v : inputs) node->inputs.push_back(v.requires_grad() ? v : Variable());
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto impl = std::make_shared<VariableImpl>();
    impl->value = std::move(outputs[i]);
    impl->requires_grad = true;
    impl->grad_fn = node;
    impl->output_index = static_cast<int>(i);
    result.push_back(Variable::from_impl(std::move(impl)));
  }
  return result;
}

Variable record(const char* name, Tensor output, const std::vector<Variable>& inputs, Node::BackwardFn backward) {
  std::vector<Tensor> outputs;
  outputs.push_back(std::move(output));
  return record(name, std::move(outputs), inputs, std::move(backward))[0];
}

}  // namespace microllm::autograd
