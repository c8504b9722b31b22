// Differentiable functions: forward through ops/, backward through the ops' backward functions.
// Each closure captures exactly the tensors its backward needs (released after backward runs).
#include "microllm/autograd/functions.h"

#include <numeric>

#include "microllm/ops/ops.h"

namespace microllm::autograd {

using Grads = std::vector<Tensor>;

Variable unary(UnaryOp op, const Variable& x, double alpha) {
  const Tensor xv = x.value();
  return record(unary_op_name(op), microllm::unary(op, xv, alpha), {x}, [op, xv, alpha](const Grads& g) {
    return Grads{microllm::unary_backward(op, xv, g[0], alpha)};
  });
}

Variable binary(BinaryOp op, const Variable& a, const Variable& b) {
  MICROLLM_CHECK(!is_comparison(op), ValueError, binary_op_name(op), "comparisons are not differentiable");
  const Tensor av = a.value(), bv = b.value();
  return record(binary_op_name(op), microllm::binary(op, av, bv), {a, b}, [op, av, bv](const Grads& g) {
    auto [ga, gb] = microllm::binary_backward(op, av, bv, g[0]);
    return Grads{ga, gb};
  });
}

Variable where(const Tensor& cond, const Variable& a, const Variable& b) {
  const Shape a_shape = a.shape(), b_shape = b.shape();
  return record("where", microllm::where(cond, a.value(), b.value()), {a, b}, [cond, a_shape, b_shape](const Grads& g) {
    auto [ga, gb] = microllm::where_backward(cond, a_shape, b_shape, g[0]);
    return Grads{ga, gb};
  });
}

Variable masked_fill(const Variable& x, const Tensor& mask, double value) {
  return record("masked_fill", microllm::masked_fill(x.value(), mask, value), {x},
                [mask](const Grads& g) { return Grads{microllm::masked_fill_backward(mask, g[0])}; });
}

Variable cast(const Variable& x, DType dtype) {
  const DType from = x.dtype();
  if (from == dtype) return x;
  return record("cast", microllm::cast(x.value(), dtype), {x},
                [from](const Grads& g) { return Grads{microllm::cast_backward(g[0], from)}; });
}

// ---- reductions ----
Variable sum(const Variable& x) { return sum(x, Dims{}, false); }
Variable mean(const Variable& x) { return mean(x, Dims{}, false); }

Variable sum(const Variable& x, const Dims& dims, bool keepdim) {
  const Shape shape = x.shape();
  return record("sum", microllm::sum(x.value(), dims, keepdim), {x}, [shape, dims, keepdim](const Grads& g) {
    return Grads{microllm::sum_backward(g[0], shape, dims, keepdim)};
  });
}

Variable mean(const Variable& x, const Dims& dims, bool keepdim) {
  const Shape shape = x.shape();
  return record("mean", microllm::mean(x.value(), dims, keepdim), {x}, [shape, dims, keepdim](const Grads& g) {
    return Grads{microllm::mean_backward(g[0], shape, dims, keepdim)};
  });
}

// ---- shapes ----
Variable reshape(const Variable& x, const Shape& shape) {
  const Shape original = x.shape();
  return record("reshape", x.value().reshape(shape), {x},
                [original](const Grads& g) { return Grads{g[0].reshape(original)}; });
}

Variable transpose(const Variable& x, int64_t dim0, int64_t dim1) {
  return record("transpose", x.value().transpose(dim0, dim1), {x},
                [dim0, dim1](const Grads& g) { return Grads{g[0].transpose(dim0, dim1)}; });
}

Variable permute(const Variable& x, const Dims& order) {
  Dims inverse = order;
  for (int i = 0; i < order.size(); ++i) inverse[normalize_dim(order[i], order.size(), "permute")] = i;
  return record("permute", x.value().permute(order), {x},
                [inverse](const Grads& g) { return Grads{g[0].permute(inverse)}; });
}

Variable narrow(const Variable& x, int64_t dim, int64_t start, int64_t length) {
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  return record("narrow", x.value().narrow(dim, start, length), {x}, [=](const Grads& g) {
    Tensor grad = Tensor::zeros(shape, dtype, g[0].device());
    grad.narrow(dim, start, length).copy_(g[0]);
    return Grads{grad};
  });
}

Variable unsqueeze(const Variable& x, int64_t dim) {
  const int d = normalize_dim(dim, x.dim() + 1, "unsqueeze");
  return record("unsqueeze", x.value().unsqueeze(d), {x}, [d](const Grads& g) { return Grads{g[0].squeeze(d)}; });
}

Variable squeeze(const Variable& x, int64_t dim) {
  const Shape shape = x.shape();
  return record("squeeze", x.value().squeeze(dim), {x}, [shape](const Grads& g) { return Grads{g[0].reshape(shape)}; });
}

Variable expand(const Variable& x, const Shape& shape) {
  const Shape original = x.shape();
  return record("expand", x.value().expand(shape), {x},
                [original](const Grads& g) { return Grads{microllm::sum_to(g[0], original)}; });
}

Variable contiguous(const Variable& x) {
  if (x.value().is_contiguous()) return x;
  return record("contiguous", x.value().contiguous(), {x}, [](const Grads& g) { return Grads{g[0]}; });
}

Variable concat(const std::vector<Variable>& xs, int64_t dim) {
  std::vector<Tensor> values;
  std::vector<int64_t> sizes;
  for (const Variable& x : xs) {
    values.push_back(x.value());
    sizes.push_back(x.value().size(dim));
  }
  return record("concat", microllm::concat(values, dim), xs,
                [sizes, dim](const Grads& g) { return microllm::concat_backward(g[0], sizes, dim); });
}

std::vector<Variable> split(const Variable& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const Device device = x.device();
  const int d = normalize_dim(dim, x.dim(), "split");
  return record("split", microllm::split(x.value(), sizes, d), {x}, [=](const Grads& g) {
    // Pieces that received no gradient contribute zeros.
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (g[i].defined()) {
        pieces.push_back(g[i]);
      } else {
        Shape piece = shape;
        piece[d] = sizes[i];
        pieces.push_back(Tensor::zeros(piece, dtype, device));
      }
    }
    return Grads{microllm::split_backward(pieces, d)};
  });
}

// ---- linear algebra ----
Variable matmul(const Variable& a, const Variable& b, bool transpose_a, bool transpose_b) {
  const Tensor av = a.value(), bv = b.value();
  return record("matmul", microllm::matmul(av, bv, transpose_a, transpose_b), {a, b},
                [av, bv, transpose_a, transpose_b](const Grads& g) {
                  auto grads = microllm::matmul_backward(av, bv, g[0], transpose_a, transpose_b);
                  return Grads{grads.grad_a, grads.grad_b};
                });
}

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  const Tensor xv = x.value(), wv = weight.value();
  const bool has_bias = bias.defined();
  std::vector<Variable> inputs{x, weight};
  if (has_bias) inputs.push_back(bias);
  return record("linear", microllm::linear(xv, wv, has_bias ? bias.value() : Tensor()), inputs,
                [xv, wv, has_bias](const Grads& g) {
                  auto grads = microllm::linear_backward(xv, wv, has_bias, g[0]);
                  Grads out{grads.grad_x, grads.grad_weight};
                  if (has_bias) out.push_back(grads.grad_bias);
                  return out;
                });
}

// ---- model blocks ----
Variable embedding(const Variable& weight, const Tensor& ids) {
  const int64_t vocab = weight.size(0);
  return record("embedding", microllm::embedding(weight.value(), ids), {weight},
                [ids, vocab](const Grads& g) { return Grads{microllm::embedding_backward(g[0], ids, vocab)}; });
}

Variable rms_norm(const Variable& x, const Variable& weight, double eps) {
  const Tensor xv = x.value(), wv = weight.value();
  RmsNormResult r = microllm::rms_norm_with_stats(xv, wv, eps);
  const Tensor rstd = r.rstd;
  return record("rms_norm", r.out, {x, weight}, [xv, wv, rstd](const Grads& g) {
    auto grads = microllm::rms_norm_backward(g[0], xv, wv, rstd);
    return Grads{grads.grad_h, grads.grad_weight};
  });
}

std::pair<Variable, Variable> rms_norm_residual(const Variable& x, const Variable& residual, const Variable& weight,
                                                double eps) {
  RmsNormResult r = microllm::rms_norm_residual(x.value(), residual.value(), weight.value(), eps);
  const Tensor h = r.h, wv = weight.value(), rstd = r.rstd;
  auto outs = record("rms_norm_residual", {r.out, r.h}, {x, residual, weight}, [h, wv, rstd](const Grads& g) {
    // Outputs: y = norm(h) and h itself; h = x + residual, so x and residual both get dL/dh.
    Tensor grad_h = g[1];
    Tensor grad_weight;
    if (g[0].defined()) {
      auto grads = microllm::rms_norm_backward(g[0], h, wv, rstd);
      grad_h = grad_h.defined() ? microllm::add(grad_h, grads.grad_h) : grads.grad_h;
      grad_weight = grads.grad_weight;
    }
    return Grads{grad_h, grad_h, grad_weight};
  });
  return {outs[0], outs[1]};
}

Variable rope(const Variable& x, const Tensor& positions, const RopeParams& params) {
  return record("rope", microllm::rope(x.value(), positions, params), {x}, [positions, params](const Grads& g) {
    return Grads{microllm::rope_backward(g[0], positions, params)};
  });
}

Variable swiglu(const Variable& gate, const Variable& up) {
  const Tensor gv = gate.value(), uv = up.value();
  return record("swiglu", microllm::swiglu(gv, uv), {gate, up}, [gv, uv](const Grads& g) {
    auto grads = microllm::swiglu_backward(gv, uv, g[0]);
    return Grads{grads.grad_gate, grads.grad_up};
  });
}

Variable softmax(const Variable& x, int64_t dim) {
  const Tensor y = microllm::softmax(x.value(), dim);
  return record("softmax", y, {x}, [y, dim](const Grads& g) { return Grads{microllm::softmax_backward(y, g[0], dim)}; });
}

Variable log_softmax(const Variable& x, int64_t dim) {
  const Tensor y = microllm::log_softmax(x.value(), dim);
  return record("log_softmax", y, {x},
                [y, dim](const Grads& g) { return Grads{microllm::log_softmax_backward(y, g[0], dim)}; });
}

Variable attention(const Variable& q, const Variable& k, const Variable& v, const AttentionParams& params,
                   const Tensor& mask) {
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  const AttentionResult forward = microllm::attention(qv, kv, vv, params, mask);
  return record("attention", forward.out, {q, k, v}, [qv, kv, vv, forward, params, mask](const Grads& g) {
    auto grads = microllm::attention_backward(qv, kv, vv, forward, g[0], params, mask);
    return Grads{grads.grad_q, grads.grad_k, grads.grad_v};
  });
}

Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index) {
  const Tensor lv = logits.value();
  return record("cross_entropy", microllm::cross_entropy(lv, targets, ignore_index), {logits},
                [lv, targets, ignore_index](const Grads& g) {
                  return Grads{microllm::cross_entropy_backward(lv, targets, g[0], ignore_index)};
                });
}

}  // namespace microllm::autograd
