// Softmax and log-softmax along any dim: checks, dispatch, and the backward rules.
// Kernels work over the last dim; another dim is moved there with a transpose view (no copy on the way
// in) and the contiguous result is transposed back, then made contiguous.
#include "microllm/ops/softmax.h"

#include "checks.h"

namespace microllm {
namespace {

Tensor softmax_forward(const char* op, const Tensor& x, int64_t dim, bool log) {
  checks::floating(op, x, "input");
  if (x.dim() == 0) return softmax_forward(op, x.reshape({1}), dim, log).reshape({});  // a scalar is a row of 1
  const int d = normalize_dim(dim, x.dim(), op);
  const int last = x.dim() - 1;
  const Tensor rows = d == last ? x : x.transpose(d, last);
  Tensor out = Tensor::empty(rows.shape(), x.dtype(), x.device());
  backend_for(x.device()).softmax(rows, log, out);
  return d == last ? out : out.transpose(d, last).contiguous();
}

Tensor softmax_grad(const char* op, const Tensor& y, const Tensor& grad_out, int64_t dim, bool log) {
  checks::floating(op, y, "output");
  checks::defined(op, grad_out, "grad_out");
  checks::same_shape(op, y, "output", grad_out, "grad_out");
  checks::same_dtype(op, y, "output", grad_out, "grad_out");
  checks::same_device(op, y, "output", grad_out, "grad_out");
  if (y.dim() == 0) return softmax_grad(op, y.reshape({1}), grad_out.reshape({1}), dim, log).reshape({});
  const int d = normalize_dim(dim, y.dim(), op);
  const int last = y.dim() - 1;
  const Tensor y_rows = d == last ? y : y.transpose(d, last);
  const Tensor g_rows = d == last ? grad_out : grad_out.transpose(d, last);
  Tensor grad_x = Tensor::empty(y_rows.shape(), y.dtype(), y.device());
  backend_for(y.device()).softmax_backward(y_rows, g_rows, log, grad_x);
  return d == last ? grad_x : grad_x.transpose(d, last).contiguous();
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_forward("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_forward("log_softmax", x, dim, true); }

// dx = y * (g - sum(g * y))
Tensor softmax_backward(const Tensor& y, const Tensor& grad_out, int64_t dim) {
  return softmax_grad("softmax_backward", y, grad_out, dim, false);
}

// dx = g - exp(y) * sum(g)
Tensor log_softmax_backward(const Tensor& y, const Tensor& grad_out, int64_t dim) {
  return softmax_grad("log_softmax_backward", y, grad_out, dim, true);
}

}  // namespace microllm
