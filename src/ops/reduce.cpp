// Reductions: checks, multi-dim composition, dispatch, and the backward rules.
#include "microllm/ops/reduce.h"

#include <algorithm>

#include "checks.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/indexing.h"

namespace microllm {
namespace {

// Normalized, de-duplicated dims in descending order; empty means every dim.
std::vector<int> reduced_dims(const Dims& dims, int rank, const char* op) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int d = 0; d < rank; ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(normalize_dim(d, rank, op));
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  MICROLLM_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), ValueError, op, "dims ", dims,
                 " name a dim more than once");
  return out;
}

Tensor reduce_one(ReduceOp op, const Tensor& x, int dim) {
  Shape shape = x.shape();
  shape[dim] = 1;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).reduce(op, x, dim, out);
  return out;
}

Tensor reduce_dims(ReduceOp op, const Tensor& x, const Dims& dims, bool keepdim) {
  const char* name = reduce_op_name(op);
  checks::defined(name, x, "input");
  if (op == ReduceOp::mean) checks::floating(name, x, "input");
  // Integer sums accumulate and return i64 (as in PyTorch), so u8/i32 sums cannot wrap.
  if (op == ReduceOp::sum && is_integral(x.dtype()) && x.dtype() != DType::i64) {
    return reduce_dims(op, x.to(DType::i64), dims, keepdim);
  }
  if (x.dim() == 0) return x.clone();
  const std::vector<int> order = reduced_dims(dims, x.dim(), name);
  if (op == ReduceOp::max || op == ReduceOp::min) {
    for (int d : order) {
      MICROLLM_CHECK(x.size(d) > 0, ShapeError, name, "cannot reduce the empty dim ", d, " of shape ", x.shape());
    }
  }
  // All reduced dims in one pass (moved last and merged into one): partial results are never rounded
  // to a narrow dtype, so several dims accumulate once in f32 like one dim does.
  Tensor out;
  if (order.size() == 1) {
    out = reduce_one(op, x, order[0]);
  } else {
    Dims perm;
    Shape merged_shape;
    int64_t merged = 1;
    for (int d = 0; d < x.dim(); ++d) {
      if (std::find(order.begin(), order.end(), d) != order.end()) continue;
      perm.push_back(d);
      merged_shape.push_back(x.size(d));
    }
    for (auto d = order.rbegin(); d != order.rend(); ++d) {  // ascending keeps a contiguous tail a view
      perm.push_back(*d);
      merged *= x.size(*d);
    }
    merged_shape.push_back(merged);
    Shape kept_shape = x.shape();
    for (int d : order) kept_shape[d] = 1;
    out = reduce_one(op, x.permute(perm).reshape(merged_shape), merged_shape.size() - 1).view(kept_shape);
  }
  if (!keepdim) {
    for (int d : order) out = out.squeeze(d);  // descending order keeps the remaining dims' indices valid
  }
  return out;
}

// The gradient of a reduction, as grad_out broadcast back over the reduced dims.
Tensor expand_reduced(const Tensor& grad_out, const Shape& input_shape, const Dims& dims, bool keepdim) {
  Tensor g = grad_out;
  if (!keepdim && input_shape.size() > 0) {
    std::vector<int> order = reduced_dims(dims, input_shape.size(), "backward");
    std::reverse(order.begin(), order.end());  // ascending: each unsqueeze restores one dim in place
    for (int d : order) g = g.unsqueeze(d);
  }
  return g.expand(input_shape).contiguous();
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_dims(ReduceOp::sum, x, {}, false); }
Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) { return reduce_dims(ReduceOp::sum, x, dims, keepdim); }
Tensor mean(const Tensor& x) { return reduce_dims(ReduceOp::mean, x, {}, false); }
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) { return reduce_dims(ReduceOp::mean, x, dims, keepdim); }
Tensor max(const Tensor& x) { return reduce_dims(ReduceOp::max, x, {}, false); }
Tensor max(const Tensor& x, int64_t dim, bool keepdim) { return reduce_dims(ReduceOp::max, x, Dims{dim}, keepdim); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  checks::defined("argmax", x, "input");
  const Tensor src = x.dim() == 0 ? x.reshape({1}) : x;
  const int d = normalize_dim(dim, src.dim(), "argmax");
  MICROLLM_CHECK(src.size(d) > 0, ShapeError, "argmax", "cannot reduce the empty dim ", d, " of shape ", src.shape());
  Shape shape = src.shape();
  shape[d] = 1;
  Tensor out = Tensor::empty(shape, DType::i64, src.device());
  backend_for(src.device()).argmax(src, d, out);
  return keepdim ? out : out.squeeze(d);
}

Tensor argmax(const Tensor& x) { return argmax(x.reshape({-1}), 0, false); }

Tensor sum_backward(const Tensor& grad_out, const Shape& input_shape, const Dims& dims, bool keepdim) {
  checks::defined("sum_backward", grad_out, "grad_out");
  return expand_reduced(grad_out, input_shape, dims, keepdim);
}

Tensor mean_backward(const Tensor& grad_out, const Shape& input_shape, const Dims& dims, bool keepdim) {
  checks::floating("mean_backward", grad_out, "grad_out");
  int64_t count = 1;
  for (int d : reduced_dims(dims, input_shape.size(), "mean_backward")) count *= input_shape[d];
  return scale(expand_reduced(grad_out, input_shape, dims, keepdim), 1.0 / static_cast<double>(count));
}

Tensor max_backward(const Tensor& grad_out, const Tensor& x, int64_t dim, bool keepdim) {
  checks::floating("max_backward", x, "input");
  const int d = normalize_dim(dim, x.dim(), "max_backward");
  const Tensor index = argmax(x, d, /*keepdim=*/true);
  const Tensor g = keepdim ? grad_out : grad_out.unsqueeze(d);
  return scatter_add(Tensor::zeros(x.shape(), grad_out.dtype(), x.device()), d, index, g);
}

Tensor max_backward(const Tensor& grad_out, const Tensor& x) {
  const Tensor flat = x.reshape({-1});
  return max_backward(grad_out.reshape({1}), flat, 0, /*keepdim=*/true).reshape(x.shape());
}

}  // namespace microllm
