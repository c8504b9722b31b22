// Gathering, scattering, joining and ranking: checks, dispatch, backward rules.
#include "microllm/ops/indexing.h"

#include <numeric>

#include "checks.h"

namespace microllm {
namespace {

// Host-side bounds check of integer ids (CPU tensors; device kernels check their own).
void check_ids_in_range(const char* op, const Tensor& ids, int64_t limit) {
  if (!ids.device().is_cpu()) return;
  const std::vector<int64_t> values = ids.to_vector<int64_t>();
  for (size_t i = 0; i < values.size(); ++i) {
    MICROLLM_CHECK(values[i] >= 0 && values[i] < limit, IndexError, op, "index ", values[i], " at position ", i,
                   " is out of range [0, ", limit, ")");
  }
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  checks::defined("embedding", weight, "weight");
  checks::rank("embedding", weight, "weight", 2);
  checks::index_dtype("embedding", ids, "ids");
  checks::same_device("embedding", weight, "weight", ids, "ids");
  check_ids_in_range("embedding", ids, weight.size(0));
  Shape shape = ids.shape();
  shape.push_back(weight.size(1));
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  backend_for(weight.device()).embedding(weight, ids, out);
  return out;
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t vocab_size) {
  checks::floating("embedding_backward", grad_out, "grad_out");
  checks::index_dtype("embedding_backward", ids, "ids");
  checks::same_device("embedding_backward", grad_out, "grad_out", ids, "ids");
  MICROLLM_CHECK(grad_out.dim() == ids.dim() + 1, ShapeError, "embedding_backward", "grad_out shape ",
                 grad_out.shape(), " does not match ids shape ", ids.shape(), " plus one dim");
  for (int d = 0; d < ids.dim(); ++d) {
    MICROLLM_CHECK(grad_out.size(d) == ids.size(d), ShapeError, "embedding_backward", "grad_out shape ",
                   grad_out.shape(), " does not match ids shape ", ids.shape());
  }
  check_ids_in_range("embedding_backward", ids, vocab_size);
  const int64_t dim = grad_out.size(-1);
  Tensor grad_weight = Tensor::empty({vocab_size, dim}, grad_out.dtype(), grad_out.device());
  // The row count is explicit: reshape cannot infer a -1 next to a zero-width row.
  backend_for(grad_out.device())
      .embedding_backward(grad_out.reshape({ids.numel(), dim}), ids.reshape({-1}), grad_weight);
  return grad_weight;
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  MICROLLM_CHECK(!tensors.empty(), ValueError, "concat", "needs at least one tensor");
  const Tensor& first = tensors[0];
  checks::defined("concat", first, "tensors[0]");
  const int d = normalize_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    checks::defined("concat", t, "tensor");
    MICROLLM_CHECK(t.dtype() == first.dtype(), DTypeError, "concat", "tensor ", i, " has dtype ", t.dtype(),
                   " but tensor 0 has ", first.dtype());
    MICROLLM_CHECK(t.device() == first.device(), DeviceError, "concat", "tensor ", i, " is on ", t.device(),
                   " but tensor 0 is on ", first.device());
    MICROLLM_CHECK(t.dim() == first.dim(), ShapeError, "concat", "tensor ", i, " has shape ", t.shape(),
                   " but tensor 0 has shape ", first.shape());
    for (int k = 0; k < t.dim(); ++k) {
      MICROLLM_CHECK(k == d || t.size(k) == first.size(k), ShapeError, "concat", "tensor ", i, " has shape ",
                     t.shape(), " but tensor 0 has shape ", first.shape(), " (they may differ only in dim ", d, ")");
    }
    shape[d] += t.size(d);
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    out.narrow(d, start, t.size(d)).copy_(t);
    start += t.size(d);
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  checks::defined("split", x, "input");
  const int d = normalize_dim(dim, x.dim(), "split");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  MICROLLM_CHECK(total == x.size(d), ShapeError, "split", "sizes add up to ", total, " but dim ", d, " of shape ",
                 x.shape(), " has ", x.size(d));
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t size : sizes) {
    MICROLLM_CHECK(size >= 0, ValueError, "split", "negative size ", size);
    pieces.push_back(x.narrow(d, start, size));
    start += size;
  }
  return pieces;
}

std::vector<Tensor> concat_backward(const Tensor& grad_out, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> grads;
  for (const Tensor& piece : split(grad_out, sizes, dim)) grads.push_back(piece.contiguous());
  return grads;
}

Tensor split_backward(const std::vector<Tensor>& grad_outs, int64_t dim) { return concat(grad_outs, dim); }

TopK topk(const Tensor& x, int64_t k) {
  checks::defined("topk", x, "input");
  MICROLLM_CHECK(x.dim() >= 1, ShapeError, "topk", "needs rank >= 1, got shape ", x.shape());
  MICROLLM_CHECK(k >= 0 && k <= x.size(-1), ValueError, "topk", "k = ", k, " is out of range for the last dim of ",
                 x.shape());
  Shape shape = x.shape();
  shape[shape.size() - 1] = k;
  TopK result{Tensor::empty(shape, x.dtype(), x.device()), Tensor::empty(shape, DType::i64, x.device())};
  if (k > 0 && result.values.numel() > 0) backend_for(x.device()).topk(x, k, result.values, result.indices);
  return result;
}

Tensor topk_backward(const Tensor& grad_values, const Tensor& indices, const Shape& input_shape) {
  checks::floating("topk_backward", grad_values, "grad_values");
  return scatter_add(Tensor::zeros(input_shape, grad_values.dtype(), grad_values.device()), -1, indices, grad_values);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  checks::defined("scatter_add", x, "input");
  checks::defined("scatter_add", src, "src");
  MICROLLM_CHECK(index.defined() && index.dtype() == DType::i64, DTypeError, "scatter_add", "index must be i64");
  checks::same_dtype("scatter_add", x, "input", src, "src");
  checks::same_device("scatter_add", x, "input", src, "src");
  checks::same_device("scatter_add", x, "input", index, "index");
  checks::same_shape("scatter_add", src, "src", index, "index");
  const int d = normalize_dim(dim, x.dim(), "scatter_add");
  MICROLLM_CHECK(src.dim() == x.dim(), ShapeError, "scatter_add", "src shape ", src.shape(), " and input shape ",
                 x.shape(), " differ in rank");
  for (int k = 0; k < x.dim(); ++k) {
    MICROLLM_CHECK(k == d || src.size(k) == x.size(k), ShapeError, "scatter_add", "src shape ", src.shape(),
                   " must match input shape ", x.shape(), " outside dim ", d);
  }
  check_ids_in_range("scatter_add", index, x.size(d));
  Tensor out = x.clone();
  if (src.numel() > 0) backend_for(x.device()).scatter_add(index, src, d, out);
  return out;
}

}  // namespace microllm
