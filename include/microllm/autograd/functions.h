// Differentiable functions: each runs the op of the same name from ops/ and records its backward
// (the op's own backward function) when an input requires a gradient. Shapes and dtypes follow ops/.
#pragma once

#include <utility>
#include <vector>

#include "microllm/autograd/variable.h"
#include "microllm/backend/kernel_params.h"

namespace microllm::autograd {

// ---- elementwise ----
Variable unary(UnaryOp op, const Variable& x, double alpha = 0);
inline Variable neg(const Variable& x) { return unary(UnaryOp::neg, x); }
inline Variable exp(const Variable& x) { return unary(UnaryOp::exp, x); }
inline Variable log(const Variable& x) { return unary(UnaryOp::log, x); }
inline Variable sqrt(const Variable& x) { return unary(UnaryOp::sqrt, x); }
inline Variable rsqrt(const Variable& x) { return unary(UnaryOp::rsqrt, x); }
inline Variable sigmoid(const Variable& x) { return unary(UnaryOp::sigmoid, x); }
inline Variable silu(const Variable& x) { return unary(UnaryOp::silu, x); }
inline Variable gelu(const Variable& x, bool tanh_approximation = false) {
  return unary(tanh_approximation ? UnaryOp::gelu_tanh : UnaryOp::gelu, x);
}
inline Variable tanh(const Variable& x) { return unary(UnaryOp::tanh, x); }
inline Variable square(const Variable& x) { return unary(UnaryOp::square, x); }
inline Variable scale(const Variable& x, double alpha) { return unary(UnaryOp::scale, x, alpha); }

Variable binary(BinaryOp op, const Variable& a, const Variable& b);  // arithmetic ops only
inline Variable add(const Variable& a, const Variable& b) { return binary(BinaryOp::add, a, b); }
inline Variable sub(const Variable& a, const Variable& b) { return binary(BinaryOp::sub, a, b); }
inline Variable mul(const Variable& a, const Variable& b) { return binary(BinaryOp::mul, a, b); }
inline Variable div(const Variable& a, const Variable& b) { return binary(BinaryOp::div, a, b); }

Variable where(const Tensor& cond, const Variable& a, const Variable& b);
Variable masked_fill(const Variable& x, const Tensor& mask, double value);
Variable cast(const Variable& x, DType dtype);

// ---- reductions ----
Variable sum(const Variable& x);
Variable sum(const Variable& x, const Dims& dims, bool keepdim = false);
Variable mean(const Variable& x);
Variable mean(const Variable& x, const Dims& dims, bool keepdim = false);

// ---- shapes (the backward undoes the view) ----
Variable reshape(const Variable& x, const Shape& shape);
Variable transpose(const Variable& x, int64_t dim0, int64_t dim1);
Variable permute(const Variable& x, const Dims& order);
Variable narrow(const Variable& x, int64_t dim, int64_t start, int64_t length);
Variable unsqueeze(const Variable& x, int64_t dim);
Variable squeeze(const Variable& x, int64_t dim);
Variable expand(const Variable& x, const Shape& shape);
Variable contiguous(const Variable& x);
Variable concat(const std::vector<Variable>& xs, int64_t dim);
std::vector<Variable> split(const Variable& x, const std::vector<int64_t>& sizes, int64_t dim);

// ---- linear algebra ----
Variable matmul(const Variable& a, const Variable& b, bool transpose_a = false, bool transpose_b = false);
// x [..., in] @ weight[out, in]^T (+ bias [out]); bias may be an undefined Variable.
Variable linear(const Variable& x, const Variable& weight, const Variable& bias = Variable());

// ---- model blocks ----
Variable embedding(const Variable& weight, const Tensor& ids);
Variable rms_norm(const Variable& x, const Variable& weight, double eps);
// Returns {y, h} with h = x + residual (the residual stream) and y = rms_norm(h).
std::pair<Variable, Variable> rms_norm_residual(const Variable& x, const Variable& residual, const Variable& weight,
                                                double eps);
Variable rope(const Variable& x, const Tensor& positions, const RopeParams& params);
Variable swiglu(const Variable& gate, const Variable& up);
Variable softmax(const Variable& x, int64_t dim = -1);
Variable log_softmax(const Variable& x, int64_t dim = -1);
// q [B, Hq, T, D], k and v [B, Hkv, S, D] (ops/attention.h).
Variable attention(const Variable& q, const Variable& k, const Variable& v, const AttentionParams& params = {},
                   const Tensor& mask = Tensor());
Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace microllm::autograd
