// Gated activations: checks, dispatch, backward.
#include "microllm/ops/activation.h"

#include "checks.h"

namespace microllm {

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  checks::floating("swiglu", gate, "gate");
  checks::defined("swiglu", up, "up");
  checks::same_shape("swiglu", gate, "gate", up, "up");
  checks::same_dtype("swiglu", gate, "gate", up, "up");
  checks::same_device("swiglu", gate, "gate", up, "up");
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  backend_for(gate.device()).swiglu(gate, up, out);
  return out;
}

SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out) {
  checks::floating("swiglu_backward", gate, "gate");
  checks::defined("swiglu_backward", up, "up");
  checks::defined("swiglu_backward", grad_out, "grad_out");
  checks::same_shape("swiglu_backward", gate, "gate", up, "up");
  checks::same_shape("swiglu_backward", gate, "gate", grad_out, "grad_out");
  checks::same_dtype("swiglu_backward", gate, "gate", up, "up");
  checks::same_dtype("swiglu_backward", gate, "gate", grad_out, "grad_out");
  checks::same_device("swiglu_backward", gate, "gate", up, "up");
  checks::same_device("swiglu_backward", gate, "gate", grad_out, "grad_out");
  SwigluGrads grads{Tensor::empty(gate.shape(), gate.dtype(), gate.device()),
                    Tensor::empty(gate.shape(), gate.dtype(), gate.device())};
  backend_for(gate.device()).swiglu_backward(gate, up, grad_out, grads.grad_gate, grads.grad_up);
  return grads;
}

}  // namespace microllm
