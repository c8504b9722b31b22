// Elementwise ops: checks, broadcasting, dispatch, and the backward rules.
#include "microllm/ops/elementwise.h"

#include "checks.h"
#include "microllm/ops/reduce.h"

namespace microllm {

Tensor unary(UnaryOp op, const Tensor& x, double alpha) {
  const char* name = unary_op_name(op);
  checks::floating(name, x, "input");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).unary(op, x, alpha, out);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, double alpha) {
  const char* name = unary_op_name(op);
  checks::floating(name, x, "input");
  checks::defined(name, grad_out, "grad_out");
  checks::same_shape(name, x, "input", grad_out, "grad_out");
  checks::same_dtype(name, x, "input", grad_out, "grad_out");
  checks::same_device(name, x, "input", grad_out, "grad_out");
  Tensor grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).unary_backward(op, x, alpha, grad_out, grad_x);
  return grad_x;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  checks::defined(name, a, "a");
  checks::defined(name, b, "b");
  checks::same_dtype(name, a, "a", b, "b");
  checks::same_device(name, a, "a", b, "b");
  const bool integer_ok = is_comparison(op) || op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul ||
                          op == BinaryOp::maximum || op == BinaryOp::minimum;
  if (!integer_ok || !is_integral(a.dtype())) checks::floating(name, a, "a");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, is_comparison(op) ? DType::u8 : a.dtype(), a.device());
  backend_for(a.device()).binary(op, a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  MICROLLM_CHECK(x.dim() >= shape.size(), ShapeError, "sum_to", "cannot sum shape ", x.shape(), " to ", shape);
  const int lead = x.dim() - shape.size();
  Dims dims;
  for (int d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && x.size(d) != 1) {
      dims.push_back(d);
    } else {
      MICROLLM_CHECK(shape[d - lead] == x.size(d), ShapeError, "sum_to", "cannot sum shape ", x.shape(), " to ",
                     shape);
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, /*keepdim=*/true).reshape(shape);
}

std::pair<Tensor, Tensor> binary_backward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& grad_out) {
  const char* name = binary_op_name(op);
  MICROLLM_CHECK(!is_comparison(op), ValueError, name, "comparisons have no gradient");
  checks::floating(name, a, "a");
  checks::same_dtype(name, a, "a", b, "b");
  checks::same_dtype(name, a, "a", grad_out, "grad_out");
  const Tensor& g = grad_out;
  switch (op) {
    case BinaryOp::add:  // d(a+b) = (g, g)
      return {sum_to(g, a.shape()), sum_to(g, b.shape())};
    case BinaryOp::sub:  // d(a-b) = (g, -g)
      return {sum_to(g, a.shape()), sum_to(neg(g), b.shape())};
    case BinaryOp::mul:  // d(ab) = (g b, g a)
      return {sum_to(mul(g, b), a.shape()), sum_to(mul(g, a), b.shape())};
    case BinaryOp::div:  // d(a/b) = (g / b, -g a / b^2)
      return {sum_to(div(g, b), a.shape()), sum_to(neg(div(mul(g, a), mul(b, b))), b.shape())};
    case BinaryOp::maximum:
    case BinaryOp::minimum: {
      // The winner takes g; a tie splits it in half (PyTorch's rule).
      const Tensor a_wins = op == BinaryOp::maximum ? gt(a, b) : lt(a, b);
      const Tensor tie = eq(a, b);
      const Tensor zero = Tensor::zeros({}, g.dtype(), g.device());
      const Tensor half_g = scale(g, 0.5);
      const Tensor grad_a = where(a_wins, g, where(tie, half_g, zero));
      const Tensor grad_b = where(a_wins, zero, where(tie, half_g, g));
      return {sum_to(grad_a, a.shape()), sum_to(grad_b, b.shape())};
    }
    default:
      break;
  }
  throw ValueError(name, "no gradient rule");
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  checks::defined("where", cond, "cond");
  checks::defined("where", a, "a");
  checks::defined("where", b, "b");
  MICROLLM_CHECK(cond.dtype() == DType::u8, DTypeError, "where", "cond must be u8, got ", cond.dtype());
  checks::same_dtype("where", a, "a", b, "b");
  checks::same_device("where", a, "a", b, "b");
  checks::same_device("where", a, "a", cond, "cond");
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  backend_for(a.device()).where(cond.expand(shape), a.expand(shape), b.expand(shape), out);
  return out;
}

std::pair<Tensor, Tensor> where_backward(const Tensor& cond, const Shape& a_shape, const Shape& b_shape,
                                         const Tensor& grad_out) {
  const Tensor zero = Tensor::zeros({}, grad_out.dtype(), grad_out.device());
  return {sum_to(where(cond, grad_out, zero), a_shape), sum_to(where(cond, zero, grad_out), b_shape)};
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  checks::defined("masked_fill", x, "input");
  checks::defined("masked_fill", mask, "mask");
  MICROLLM_CHECK(mask.dtype() == DType::u8, DTypeError, "masked_fill", "mask must be u8, got ", mask.dtype());
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  MICROLLM_CHECK(shape == x.shape(), ShapeError, "masked_fill", "mask shape ", mask.shape(),
                 " does not broadcast to input shape ", x.shape());
  return where(mask, Tensor::scalar(value, x.dtype(), x.device()), x);
}

Tensor masked_fill_backward(const Tensor& mask, const Tensor& grad_out) {
  return where(mask, Tensor::zeros({}, grad_out.dtype(), grad_out.device()), grad_out);
}

Tensor cast(const Tensor& x, DType dtype) {
  checks::defined("cast", x, "input");
  return x.to(dtype);
}

Tensor cast_backward(const Tensor& grad_out, DType input_dtype) { return grad_out.to(input_dtype); }

}  // namespace microllm
