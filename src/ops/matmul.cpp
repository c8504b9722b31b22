// Matrix products: checks, batch broadcasting, dispatch, backward rules, and Linear.
#include "microllm/ops/matmul.h"

#include "checks.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/reduce.h"

namespace microllm {
namespace {

Shape batch_shape(const Tensor& t) {
  Shape batch;
  for (int d = 0; d + 2 < t.dim(); ++d) batch.push_back(t.size(d));
  return batch;
}

// [..., cols] as [rows, cols]. rows is explicit: reshape cannot infer a -1 next to a size-0 dim.
Tensor as_matrix(const Tensor& t, int64_t cols) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return t.reshape({rows, cols});
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  checks::floating("matmul", a, "a");
  checks::floating("matmul", b, "b");
  checks::same_dtype("matmul", a, "a", b, "b");
  checks::same_device("matmul", a, "a", b, "b");
  MICROLLM_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError, "matmul", "needs rank >= 2 operands, got ", a.shape(),
                 " and ", b.shape());
  const int64_t m = transpose_a ? a.size(-1) : a.size(-2);
  const int64_t k = transpose_a ? a.size(-2) : a.size(-1);
  const int64_t k_b = transpose_b ? b.size(-1) : b.size(-2);
  const int64_t n = transpose_b ? b.size(-2) : b.size(-1);
  MICROLLM_CHECK(k == k_b, ShapeError, "matmul", "inner dims differ: a ", a.shape(), (transpose_a ? "^T" : ""),
                 " has ", k, " columns, b ", b.shape(), (transpose_b ? "^T" : ""), " has ", k_b, " rows");
  const Shape batch = broadcast_shapes(batch_shape(a), batch_shape(b), "matmul");
  Tensor out = Tensor::empty(with_matrix(batch, m, n), a.dtype(), a.device());
  const Tensor a_full = a.expand(with_matrix(batch, a.size(-2), a.size(-1)));
  const Tensor b_full = b.expand(with_matrix(batch, b.size(-2), b.size(-1)));
  backend_for(a.device()).matmul(a_full, b_full, transpose_a, transpose_b, Tensor(), Tensor(), out);
  return out;
}

MatmulGrads matmul_backward(const Tensor& a, const Tensor& b, const Tensor& grad_out, bool transpose_a,
                            bool transpose_b) {
  checks::floating("matmul_backward", grad_out, "grad_out");
  const Tensor& g = grad_out;
  // out = A' B' with A' = op(a), B' = op(b): dA' = G B'^T, dB' = A'^T G; a transposed operand takes the
  // transpose of its gradient, which the flags express without copies.
  Tensor grad_a = transpose_a ? matmul(b, g, transpose_b, true) : matmul(g, b, false, !transpose_b);
  Tensor grad_b = transpose_b ? matmul(g, a, true, transpose_a) : matmul(a, g, !transpose_a, false);
  return {sum_to(grad_a, a.shape()), sum_to(grad_b, b.shape())};
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_add(x, weight, bias, Tensor());
}

Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& addend) {
  checks::floating("linear", x, "input");
  checks::rank("linear", weight, "weight", 2);
  checks::same_dtype("linear", x, "input", weight, "weight");
  checks::same_device("linear", x, "input", weight, "weight");
  MICROLLM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError, "linear", "weight shape ", weight.shape(),
                 " does not match the last dim of input ", x.shape());
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = weight.size(0);
  if (bias.defined()) {
    MICROLLM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, "linear", "bias shape ",
                   bias.shape(), " does not match weight shape ", weight.shape());
    checks::same_dtype("linear", x, "input", bias, "bias");
    checks::same_device("linear", x, "input", bias, "bias");
  }
  Tensor addend2;  // [N, out] contiguous
  if (addend.defined()) {
    MICROLLM_CHECK(addend.shape() == out_shape, ShapeError, "linear", "addend shape ", addend.shape(),
                   " does not match the output shape ", out_shape);
    checks::same_dtype("linear", x, "input", addend, "addend");
    checks::same_device("linear", x, "input", addend, "addend");
    addend2 = addend.contiguous().view({-1, weight.size(0)});
  }
  // [N, in] @ [out, in]^T (+ bias) (+ addend), both added in the matmul's epilogue
  const Tensor x2 = as_matrix(x, x.size(-1));
  Tensor y = Tensor::empty({x2.size(0), weight.size(0)}, x.dtype(), x.device());
  backend_for(x.device()).matmul(x2, weight, false, true, bias, addend2, y);
  return y.view(out_shape);
}

LinearGrads linear_backward(const Tensor& x, const Tensor& weight, bool has_bias, const Tensor& grad_out) {
  checks::floating("linear_backward", grad_out, "grad_out");
  checks::rank("linear_backward", weight, "weight", 2);
  Shape expected = x.shape();
  MICROLLM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError, "linear_backward", "weight shape ",
                 weight.shape(), " does not match the last dim of input ", x.shape());
  expected[expected.size() - 1] = weight.size(0);
  MICROLLM_CHECK(grad_out.shape() == expected, ShapeError, "linear_backward", "grad_out shape ", grad_out.shape(),
                 " does not match the output shape ", expected);
  const Tensor g = as_matrix(grad_out, weight.size(0));  // [N, out]
  const Tensor x2 = as_matrix(x, weight.size(1));        // [N, in]
  LinearGrads grads;
  grads.grad_x = matmul(g, weight).view(x.shape());  // [N, out] @ [out, in]
  grads.grad_weight = matmul(g, x2, true, false);    // [out, N] @ [N, in]
  if (has_bias) grads.grad_bias = sum(g, Dims{0});
  return grads;
}

}  // namespace microllm
