#include "microllm/nn/module.h"

#include <algorithm>

namespace microllm::nn {

Variable& Module::register_parameter(const std::string& name, Tensor value, bool weight_decay) {
  for (const Owned& p : parameters_) {
    MICROLLM_CHECK(p.name != name, ValueError, "nn", "parameter '", name, "' is registered twice");
  }
  parameters_.push_back({name, std::make_unique<Variable>(std::move(value), true), weight_decay});
  return *parameters_.back().variable;
}

void Module::register_shared_parameter(const std::string& name, Variable* variable) {
  shared_.emplace_back(name, variable);
}

void Module::collect(const std::string& prefix, std::vector<ParameterInfo>& out,
                     std::vector<const Variable*>& seen) const {
  for (const Owned& p : parameters_) {
    if (std::find(seen.begin(), seen.end(), p.variable.get()) != seen.end()) continue;
    seen.push_back(p.variable.get());
    out.push_back({prefix + p.name, p.variable.get(), p.weight_decay});
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, seen);
}

std::vector<ParameterInfo> Module::named_parameters(const std::string& prefix) const {
  std::vector<ParameterInfo> out;
  std::vector<const Variable*> seen;
  collect(prefix, out, seen);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const ParameterInfo& p : named_parameters()) total += p.variable->value().numel();
  return total;
}

Variable* Module::find_parameter(const std::string& name) {
  for (const ParameterInfo& p : named_parameters()) {
    if (p.name == name) return p.variable;
  }
  return nullptr;
}

void Module::to(Device device) {
  MemoryCategoryScope memory(MemoryCategory::weights);
  for (const ParameterInfo& p : named_parameters()) {
    *p.variable = Variable(p.variable->value().to(device), p.variable->requires_grad());
  }
}

void Module::to(DType dtype) {
  MemoryCategoryScope memory(MemoryCategory::weights);
  for (const ParameterInfo& p : named_parameters()) {
    *p.variable = Variable(p.variable->value().to(dtype), p.variable->requires_grad());
  }
}

}  // namespace microllm::nn
