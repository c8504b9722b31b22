// Gradient checking: analytic gradients from backward() against central finite differences.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "microllm/autograd/variable.h"

namespace microllm::autograd {

struct GradcheckResult {
  bool ok = true;
  double max_error = 0;  // max over elements of |numeric - analytic| / (1 + |numeric|)
  int worst_input = -1;
  int64_t worst_element = -1;
  std::string message;   // what failed, for test output
};

// fn maps the inputs (f64 CPU tensors; those that are floating get requires_grad) to one output.
// L = sum(fn(inputs) * R) for a fixed random R (seed), checked element by element.
GradcheckResult gradcheck(const std::function<Variable(const std::vector<Variable>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps = 1e-6, double tolerance = 1e-6,
                          uint64_t seed = 1);

}  // namespace microllm::autograd
