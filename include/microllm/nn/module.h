// Modules and parameters. A Module owns its parameters and its child modules, each registered under a
// name, so a parameter's full name is the dotted path Hugging Face uses
// ("model.layers.0.self_attn.q_proj.weight") and checkpoints map one to one.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "microllm/autograd/variable.h"

namespace microllm::nn {

using autograd::Variable;

struct ParameterInfo {
  std::string name;   // the full dotted name
  Variable* variable;
  bool weight_decay;  // false for norms, biases and embeddings by default
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter below this module, depth first in registration order; a parameter shared by two
  // modules (tied embeddings) appears once, under the name it was first registered with.
  std::vector<ParameterInfo> named_parameters(const std::string& prefix = "") const;
  int64_t num_parameters() const;
  // The parameter with this full name, or null.
  Variable* find_parameter(const std::string& name);

  // Moves every parameter to `device` and/or `dtype` (a new leaf value; gradients are dropped).
  void to(Device device);
  void to(DType dtype);

 protected:
  Variable& register_parameter(const std::string& name, Tensor value, bool weight_decay = true);
  // A parameter owned elsewhere (a tied weight): listed by the owner only.
  void register_shared_parameter(const std::string& name, Variable* variable);
  template <typename M>
  M& register_module(const std::string& name, std::unique_ptr<M> module) {
    M& ref = *module;
    children_.emplace_back(name, std::move(module));
    return ref;
  }

 private:
  struct Owned {
    std::string name;
    std::unique_ptr<Variable> variable;  // stable address: optimizers keep pointers
    bool weight_decay;
  };
  void collect(const std::string& prefix, std::vector<ParameterInfo>& out, std::vector<const Variable*>& seen) const;

  std::vector<Owned> parameters_;
  std::vector<std::pair<std::string, Variable*>> shared_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

}  // namespace microllm::nn
