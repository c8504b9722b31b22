// Elementwise ops with NumPy broadcasting. Floating dtypes (f32, f16, bf16, f64) compute in f32 (f64 for
// f64) and round once to the output dtype. Comparisons also take integer tensors and return u8.
// Every op returns a new contiguous tensor; every forward has its backward beside it.
#pragma once

#include <utility>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm {

// ---- one input ----
Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0);
// grad_x = grad_out * op'(x)
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, double alpha = 0);

inline Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
inline Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
inline Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
inline Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
inline Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
inline Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
inline Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }
// Exact (erf) GELU, or the tanh approximation ("gelu_pytorch_tanh").
inline Tensor gelu(const Tensor& x, bool tanh_approximation = false) {
  return unary(tanh_approximation ? UnaryOp::gelu_tanh : UnaryOp::gelu, x);
}
inline Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
inline Tensor square(const Tensor& x) { return unary(UnaryOp::square, x); }
inline Tensor scale(const Tensor& x, double alpha) { return unary(UnaryOp::scale, x, alpha); }

// ---- two inputs, broadcast ----
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// Gradients of the arithmetic ops, each reduced back to its input's shape (comparisons have none).
std::pair<Tensor, Tensor> binary_backward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& grad_out);

inline Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
inline Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
inline Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::minimum, a, b); }
inline Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::eq, a, b); }
inline Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::ne, a, b); }
inline Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::lt, a, b); }
inline Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::le, a, b); }
inline Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::gt, a, b); }
inline Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::ge, a, b); }

// Sums a broadcast gradient back to `shape` (the rule every broadcasting backward ends with).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- selection ----
// cond (u8, nonzero = true) ? a : b, all three broadcast; a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
std::pair<Tensor, Tensor> where_backward(const Tensor& cond, const Shape& a_shape, const Shape& b_shape,
                                         const Tensor& grad_out);
// x with `value` wherever mask (u8, broadcast to x) is nonzero.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor masked_fill_backward(const Tensor& mask, const Tensor& grad_out);  // zero where filled

// ---- dtype ----
Tensor cast(const Tensor& x, DType dtype);
Tensor cast_backward(const Tensor& grad_out, DType input_dtype);

}  // namespace microllm
