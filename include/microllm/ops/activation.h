// Gated activations. (silu, gelu, sigmoid themselves are elementwise ops: ops/elementwise.h.)
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

// silu(gate) * up, the SwiGLU of Llama/Qwen MLPs; gate and up share shape and dtype.
Tensor swiglu(const Tensor& gate, const Tensor& up);
struct SwigluGrads {
  Tensor grad_gate;
  Tensor grad_up;
};
// d/dgate = g * up * s(gate) * (1 + gate * (1 - s(gate))); d/dup = g * silu(gate)
SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out);

}  // namespace microllm
