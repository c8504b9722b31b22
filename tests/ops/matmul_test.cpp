// Matmul, Linear and linear_add: every transpose flag, strided and sliced operands (the BLAS-in-place and the
// packing paths), broadcast batches, K = 0, narrow dtypes against an f64 reference, contract errors, and f64
// finite-difference gradients.
#include "microllm/ops/matmul.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "test_support.h"

namespace microllm {
namespace {

using testing::expect_op_error;
using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class MatmulTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

// op(a) @ op(b) with f64 loops over the row-major values of rank-2 operands.
std::vector<double> reference_matmul_2d(const std::vector<double>& a, int64_t a_rows, int64_t a_cols,
                                        const std::vector<double>& b, int64_t b_rows, int64_t b_cols, bool ta,
                                        bool tb) {
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, n = tb ? b_rows : b_cols;
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[static_cast<size_t>(p * a_cols + i)] : a[static_cast<size_t>(i * a_cols + p)];
        const double bv = tb ? b[static_cast<size_t>(j * b_cols + p)] : b[static_cast<size_t>(p * b_cols + j)];
        acc += av * bv;
      }
      out[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return out;
}

// The same for batched operands: leading dims broadcast (NumPy rules), written out index by index.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<double> av = host_values(a), bv = host_values(b);
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  Shape a_batch, b_batch;
  for (int d = 0; d + 2 < a.dim(); ++d) a_batch.push_back(a.size(d));
  for (int d = 0; d + 2 < b.dim(); ++d) b_batch.push_back(b.size(d));
  const Shape batch = broadcast_shapes(a_batch, b_batch, "reference");
  std::vector<double> out;
  for (int64_t flat = 0; flat < batch.numel(); ++flat) {
    // Index of this batch entry in each operand (a size-1 or missing dim contributes nothing).
    int64_t rest = flat, a_index = 0, b_index = 0, a_scale = 1, b_scale = 1;
    for (int d = batch.size() - 1; d >= 0; --d) {
      const int64_t i = rest % batch[d];
      rest /= batch[d];
      const int ad = d - (batch.size() - a_batch.size()), bd = d - (batch.size() - b_batch.size());
      if (ad >= 0) {
        a_index += (a_batch[ad] == 1 ? 0 : i) * a_scale;
        a_scale *= a_batch[ad];
      }
      if (bd >= 0) {
        b_index += (b_batch[bd] == 1 ? 0 : i) * b_scale;
        b_scale *= b_batch[bd];
      }
    }
    const std::vector<double> a_mat(av.begin() + a_index * ar * ac, av.begin() + (a_index + 1) * ar * ac);
    const std::vector<double> b_mat(bv.begin() + b_index * br * bc, bv.begin() + (b_index + 1) * br * bc);
    const std::vector<double> c = reference_matmul_2d(a_mat, ar, ac, b_mat, br, bc, ta, tb);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

// A tensor of `shape` whose storage is laid out in different ways, all holding the same values.
std::vector<Tensor> layouts(const Tensor& x) {
  std::vector<Tensor> out = {x};
  out.push_back(x.transpose(-1, -2).contiguous().transpose(-1, -2));  // column-major: BLAS reads it in place
  out.push_back(testing::non_contiguous(x));                          // column stride 2: must be packed
  // Rows and columns both strided: a slice of a larger tensor.
  Shape big = x.shape();
  big[big.size() - 2] = 2 * big[big.size() - 2] + 1;
  big[big.size() - 1] = 3 * big[big.size() - 1] + 2;
  Tensor buffer = Tensor::full(big, 1e30, x.dtype(), x.device());
  Tensor sliced = buffer.slice(-2, 1, big[big.size() - 2], 2).slice(-1, 2, big[big.size() - 1], 3);
  sliced.copy_(x);
  out.push_back(sliced);
  return out;
}

TEST_P(MatmulTest, EveryTransposeFlagAndLayoutMatchesReference) {
  const int64_t m = 7, k = 13, n = 5;
  for (DType dtype : kFloatTypes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, dtype, device());
        const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, dtype, device());
        const std::vector<double> ref = reference_matmul(a, b, ta, tb);
        for (const Tensor& la : layouts(a)) {
          for (const Tensor& lb : layouts(b)) {
            const Tensor c = matmul(la, lb, ta, tb);
            ASSERT_EQ(c.shape(), (Shape{m, n}));
            ASSERT_EQ(c.dtype(), dtype);
            ASSERT_TRUE(c.is_contiguous());
            MICROLLM_EXPECT_CLOSE(c, ref, tolerance(dtype)) << dtype << " ta " << ta << " tb " << tb << " a strides "
                                                            << la.strides() << " b strides " << lb.strides();
          }
        }
      }
    }
  }
}

TEST_P(MatmulTest, LargerOddSizes) {
  // Big enough for BLAS to block the product; sliced and transposed operands.
  const Tensor a = random_tensor({67, 131}, DType::f32, device());
  const Tensor b = random_tensor({45, 131}, DType::f32, device());
  const std::vector<double> ref = reference_matmul(a, b, false, true);
  MICROLLM_EXPECT_CLOSE(matmul(a, b, false, true), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(layouts(a)[3], layouts(b)[2], false, true), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a.t(), b.t(), true, false), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a.to(DType::bf16), b.to(DType::bf16).t()),
                        reference_matmul(a.to(DType::bf16), b.to(DType::bf16), false, true), tolerance(DType::bf16));
}

TEST_P(MatmulTest, TransposedViewsEqualTheFlags) {
  const Tensor a = random_tensor({6, 9}, DType::f32, device());
  const Tensor b = random_tensor({4, 9}, DType::f32, device());
  // a @ b^T three ways: the flag, a transposed view, and a packed copy of the transpose.
  const std::vector<double> ref = reference_matmul(a, b, false, true);
  MICROLLM_EXPECT_CLOSE(matmul(a, b, false, true), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a, b.t()), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a, b.t().contiguous()), ref, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a.t(), b.t(), true, false), ref, tolerance(DType::f32));
  // Single rows and columns (degenerate leading dimensions) and a broadcast (stride-0) operand.
  const Tensor row = random_tensor({1, 9}, DType::f32, device());
  MICROLLM_EXPECT_CLOSE(matmul(row, b, false, true), reference_matmul(row, b, false, true), tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a, row, false, true), reference_matmul(a, row, false, true), tolerance(DType::f32));
  const Tensor col = random_tensor({9, 1}, DType::f32, device());
  MICROLLM_EXPECT_CLOSE(matmul(col, row), reference_matmul(col, row, false, false), tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(a, col.expand({9, 3})), reference_matmul(a, col.expand({9, 3}), false, false),
                        tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(matmul(row.expand({5, 9}), b, false, true),
                        reference_matmul(row.expand({5, 9}), b, false, true), tolerance(DType::f32));
}

TEST_P(MatmulTest, BatchedWithBroadcastBatchDims) {
  struct Case {
    Shape a, b;
    bool ta, tb;
    Shape out;
  };
  const Case cases[] = {
      {{2, 1, 3, 4}, {3, 4, 5}, false, false, {2, 3, 3, 5}},
      {{2, 1, 4, 3}, {3, 5, 4}, true, true, {2, 3, 3, 5}},
      {{3, 4}, {2, 3, 4, 5}, false, false, {2, 3, 3, 5}},
      {{5, 3, 4}, {4, 2}, false, false, {5, 3, 2}},
      {{1, 3, 4}, {6, 2, 4}, false, true, {6, 3, 2}},
      {{2, 2, 1, 3, 4}, {2, 4, 3}, false, false, {2, 2, 2, 3, 3}},
      {{2, 2, 1, 3, 4}, {2, 1, 4, 3}, false, false, {2, 2, 1, 3, 3}},
  };
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      const Tensor a = random_tensor(c.a, dtype, device());
      const Tensor b = random_tensor(c.b, dtype, device());
      const std::vector<double> ref = reference_matmul(a, b, c.ta, c.tb);
      for (const Tensor& la : {a, testing::non_contiguous(a)}) {
        for (const Tensor& lb : {b, b.transpose(-1, -2).contiguous().transpose(-1, -2)}) {
          const Tensor out = matmul(la, lb, c.ta, c.tb);
          ASSERT_EQ(out.shape(), c.out) << c.a << " x " << c.b;
          MICROLLM_EXPECT_CLOSE(out, ref, tolerance(dtype)) << dtype << " " << c.a << " x " << c.b;
        }
      }
    }
  }
  // A batch whose operands are batch-strided views (a slice along the batch dim).
  const Tensor a = random_tensor({6, 3, 4}, DType::f32, device()).slice(0, 1, 6, 2);
  const Tensor b = random_tensor({4, 2}, DType::f32, device());
  MICROLLM_EXPECT_CLOSE(matmul(a, b), reference_matmul(a, b, false, false), tolerance(DType::f32));
}

TEST_P(MatmulTest, EmptyDims) {
  for (DType dtype : kFloatTypes) {
    // K = 0: every output is an empty sum, 0 (the output starts poisoned with NaN).
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = Tensor::zeros(ta ? Shape{0, 3} : Shape{3, 0}, dtype, device());
        const Tensor b = Tensor::zeros(tb ? Shape{4, 0} : Shape{0, 4}, dtype, device());
        const Tensor c = matmul(a, b, ta, tb);
        ASSERT_EQ(c.shape(), (Shape{3, 4}));
        EXPECT_EQ(host_values(c), std::vector<double>(12, 0.0)) << dtype << " ta " << ta << " tb " << tb;
      }
    }
    const Tensor batched = matmul(Tensor::zeros({2, 3, 0}, dtype, device()), Tensor::zeros({0, 5}, dtype, device()));
    EXPECT_EQ(host_values(batched), std::vector<double>(30, 0.0));
    EXPECT_EQ(matmul(Tensor::zeros({0, 3}, dtype, device()), random_tensor({3, 4}, dtype, device())).shape(),
              (Shape{0, 4}));
    EXPECT_EQ(matmul(random_tensor({2, 3}, dtype, device()), Tensor::zeros({3, 0}, dtype, device())).shape(),
              (Shape{2, 0}));
    EXPECT_EQ(matmul(Tensor::zeros({0, 2, 3}, dtype, device()), random_tensor({3, 4}, dtype, device())).shape(),
              (Shape{0, 2, 4}));
  }
}

TEST_P(MatmulTest, ContractErrorsNameTheOp) {
  const Tensor a = random_tensor({2, 3}, DType::f32, device());
  expect_op_error<ShapeError>(
      [&] {
        matmul(a, random_tensor({4, 5}, DType::f32, device()));
      },
      "matmul", {"inner dims", "[2, 3]", "[4, 5]"});
  expect_op_error<ShapeError>([&] { matmul(a, a, false, false); }, "matmul");
  expect_op_error<ShapeError>([&] { matmul(a, random_tensor({3}, DType::f32, device())); }, "matmul", {"rank"});
  expect_op_error<ShapeError>(
      [&] {
        matmul(random_tensor({2, 2, 3}, DType::f32, device()), random_tensor({3, 3, 4}, DType::f32, device()));
      },
      "matmul", {"broadcast"});
  expect_op_error<DTypeError>([&] { matmul(a, random_tensor({3, 2}, DType::f64, device())); }, "matmul");
  expect_op_error<DTypeError>([&] { matmul(a.to(DType::i32), a.to(DType::i32), false, true); }, "matmul");
  expect_op_error<DTypeError>([&] { matmul(a.to(DType::f8_e4m3fn), a.to(DType::f8_e4m3fn), false, true); }, "matmul");
  expect_op_error<ValueError>([&] { matmul(Tensor(), a); }, "matmul");
  EXPECT_NO_THROW(matmul(a, a, false, true));
  EXPECT_NO_THROW(matmul(a, a, true, false));
}

TEST_P(MatmulTest, GradientsMatchFiniteDifferencesForEveryFlag) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  // op(a) is [..., M, K] and op(b) [..., K, N] with M = 3, K = 4, N = 2.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Shape a_mat = ta ? Shape{4, 3} : Shape{3, 4};
      const Shape b_mat = tb ? Shape{2, 4} : Shape{4, 2};
      auto batched = [](Shape batch, const Shape& mat) {
        batch.push_back(mat[0]);
        batch.push_back(mat[1]);
        return batch;
      };
      for (const auto& [a_batch, b_batch] : {std::pair{Shape{}, Shape{}}, std::pair{Shape{2, 1}, Shape{3}},
                                             std::pair{Shape{}, Shape{2}}, std::pair{Shape{2}, Shape{1}}}) {
        SCOPED_TRACE(std::string("ta ") + (ta ? "1" : "0") + " tb " + (tb ? "1" : "0") + " batches " + a_batch.str() +
                     " " + b_batch.str());
        const Tensor a = random_tensor(batched(a_batch, a_mat), DType::f64);
        const Tensor b = random_tensor(batched(b_batch, b_mat), DType::f64);
        testing::expect_gradients_match(
            {a, b}, [&](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); },
            [&](const std::vector<Tensor>& in, const Tensor& g) {
              const MatmulGrads grads = matmul_backward(in[0], in[1], g, ta, tb);
              return std::vector<Tensor>{grads.grad_a, grads.grad_b};
            });
      }
    }
  }
}

TEST_P(MatmulTest, BackwardOfNarrowDtypesMatchesF64) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor a = random_tensor({2, 5, 6}, dtype, device());
    const Tensor b = random_tensor({6, 3}, dtype, device());
    const Tensor g = random_tensor({2, 5, 3}, dtype, device());
    const MatmulGrads got = matmul_backward(a, b, g);
    const MatmulGrads want = matmul_backward(a.to(DType::f64), b.to(DType::f64), g.to(DType::f64));
    ASSERT_EQ(got.grad_a.dtype(), dtype);
    ASSERT_EQ(got.grad_b.shape(), (Shape{6, 3}));
    MICROLLM_EXPECT_CLOSE(got.grad_a, want.grad_a, 2 * tolerance(dtype)) << dtype;
    MICROLLM_EXPECT_CLOSE(got.grad_b, want.grad_b, 2 * tolerance(dtype)) << dtype;
  }
}

// ---- linear ----

TEST_P(MatmulTest, LinearMatchesReference) {
  const int64_t in = 7, out = 5;
  for (DType dtype : kFloatTypes) {
    const Tensor x = random_tensor({2, 3, in}, dtype, device());
    const Tensor weight = random_tensor({out, in}, dtype, device());
    const Tensor bias = random_tensor({out}, dtype, device());
    for (const Tensor& input : {x, testing::non_contiguous(x), x.transpose(0, 1)}) {
      const std::vector<double> xv = host_values(input), wv = host_values(weight), bv = host_values(bias);
      for (bool with_bias : {false, true}) {
        const Tensor y = linear(input, testing::non_contiguous(weight), with_bias ? bias : Tensor());
        Shape shape = input.shape();
        shape[2] = out;
        ASSERT_EQ(y.shape(), shape);
        ASSERT_EQ(y.dtype(), dtype);
        std::vector<double> ref;
        for (int64_t r = 0; r < input.numel() / in; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            double acc = with_bias ? bv[static_cast<size_t>(o)] : 0.0;
            for (int64_t i = 0; i < in; ++i)
              acc += xv[static_cast<size_t>(r * in + i)] * wv[static_cast<size_t>(o * in + i)];
            ref.push_back(acc);
          }
        }
        MICROLLM_EXPECT_CLOSE(y, ref, tolerance(dtype)) << dtype << " bias " << with_bias;
      }
    }
  }
  // A single vector.
  const Tensor w = random_tensor({4, 3}, DType::f32, device());
  const Tensor v = random_tensor({3}, DType::f32, device());
  EXPECT_EQ(linear(v, w).shape(), (Shape{4}));
  MICROLLM_EXPECT_CLOSE(linear(v, w), reference_matmul(v.view({1, 3}), w, false, true), tolerance(DType::f32));
}

// linear_add: addend + x @ w^T (+ bias), one rounding, against an f64 reference; decode-sized rows (the CUDA
// GEMV's epilogue) and larger ones (cuBLASLt's beta = 1), strided inputs and addends, K = 0, contract errors.
TEST_P(MatmulTest, LinearAddMatchesReference) {
  for (DType dtype : kFloatTypes) {
    for (int64_t rows : {1, 6, 67}) {
      for (int64_t in : {int64_t{0}, int64_t{64}}) {
        const int64_t out = 48;
        const Tensor x = random_tensor({rows, in}, dtype, device());
        const Tensor weight = random_tensor({out, in}, dtype, device());
        const Tensor bias = random_tensor({out}, dtype, device());
        const Tensor addend_storage = random_tensor({out, rows}, dtype, device());
        for (bool strided_addend : {false, true}) {
          // A transposed view as the addend: linear_add makes it contiguous, the values are the same.
          const Tensor addend =
              strided_addend ? addend_storage.transpose(0, 1) : addend_storage.transpose(0, 1).contiguous();
          const std::vector<double> xv = host_values(x), wv = host_values(weight), bv = host_values(bias);
          const std::vector<double> av = host_values(addend);
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(str_cat(dtype, " rows ", rows, " in ", in, with_bias ? " bias" : "",
                                 strided_addend ? " strided addend" : ""));
            const Tensor y = linear_add(x, weight, with_bias ? bias : Tensor(), addend);
            ASSERT_EQ(y.shape(), (Shape{rows, out}));
            ASSERT_EQ(y.dtype(), dtype);
            std::vector<double> ref;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t o = 0; o < out; ++o) {
                double acc = av[static_cast<size_t>(r * out + o)] + (with_bias ? bv[static_cast<size_t>(o)] : 0.0);
                for (int64_t i = 0; i < in; ++i)
                  acc += xv[static_cast<size_t>(r * in + i)] * wv[static_cast<size_t>(o * in + i)];
                ref.push_back(acc);
              }
            }
            MICROLLM_EXPECT_CLOSE(y, ref, tolerance(dtype));
          }
        }
      }
    }
  }
  const Tensor x = random_tensor({2, 7}, DType::f32, device());
  const Tensor w = random_tensor({5, 7}, DType::f32, device());
  expect_op_error<ShapeError>(
      [&] {
        linear_add(x, w, Tensor(), random_tensor({2, 4}, DType::f32, device()));
      },
      "linear", {"addend", "[2, 4]", "[2, 5]"});
  expect_op_error<DTypeError>(
      [&] {
        linear_add(x, w, Tensor(), random_tensor({2, 5}, DType::f64, device()));
      },
      "linear", {"addend"});
}

TEST_P(MatmulTest, LinearWithZeroFeatures) {
  // No input features: y is the bias; no output features: y is empty. -1 cannot be inferred here.
  const Tensor x = Tensor::zeros({2, 3, 0}, DType::f32, device());
  const Tensor bias = Tensor::from_vector<float>({1, 2, 3, 4, 5}, {5}).to(device());
  const Tensor y = linear(x, Tensor::zeros({5, 0}, DType::f32, device()), bias);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(y.select(0, 1).select(0, 2).to_vector<float>(), bias.to_vector<float>());
  const LinearGrads grads = linear_backward(x, Tensor::zeros({5, 0}, DType::f32, device()), true,
                                            Tensor::ones({2, 3, 5}, DType::f32, device()));
  EXPECT_EQ(grads.grad_x.shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(grads.grad_weight.shape(), (Shape{5, 0}));
  EXPECT_EQ(grads.grad_bias.to_vector<float>(), std::vector<float>(5, 6.0f));
  const Tensor w0 = Tensor::zeros({0, 4}, DType::f32, device());
  const Tensor x4 = random_tensor({2, 4}, DType::f32, device());
  EXPECT_EQ(linear(x4, w0).shape(), (Shape{2, 0}));
  const LinearGrads empty_out = linear_backward(x4, w0, false, Tensor::zeros({2, 0}, DType::f32, device()));
  EXPECT_EQ(host_values(empty_out.grad_x), std::vector<double>(8, 0.0));
  EXPECT_EQ(empty_out.grad_weight.shape(), (Shape{0, 4}));
}

TEST_P(MatmulTest, LinearContractErrors) {
  const Tensor x = random_tensor({2, 7}, DType::f32, device());
  const Tensor w = random_tensor({5, 7}, DType::f32, device());
  expect_op_error<ShapeError>(
      [&] {
        linear(x, random_tensor({5, 6}, DType::f32, device()));
      },
      "linear", {"[5, 6]", "[2, 7]"});
  expect_op_error<ShapeError>([&] { linear(x, w.view({35})); }, "linear");
  expect_op_error<ShapeError>([&] { linear(x, w, random_tensor({4}, DType::f32, device())); }, "linear", {"bias"});
  expect_op_error<ShapeError>([&] { linear(x, w, random_tensor({1, 5}, DType::f32, device())); }, "linear", {"bias"});
  expect_op_error<DTypeError>([&] { linear(x.to(DType::i64), w); }, "linear");
}

TEST_P(MatmulTest, LinearGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor x = random_tensor({2, 3, 4}, DType::f64);
  const Tensor weight = random_tensor({5, 4}, DType::f64);
  const Tensor bias = random_tensor({5}, DType::f64);
  testing::expect_gradients_match(
      {x, weight, bias}, [&](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        const LinearGrads grads = linear_backward(in[0], in[1], true, g);
        return std::vector<Tensor>{grads.grad_x, grads.grad_weight, grads.grad_bias};
      });
  testing::expect_gradients_match(
      {x, weight}, [&](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        const LinearGrads grads = linear_backward(in[0], in[1], false, g);
        EXPECT_FALSE(grads.grad_bias.defined());
        return std::vector<Tensor>{grads.grad_x, grads.grad_weight};
      });
  // A non-contiguous input and gradient.
  const Tensor xt = random_tensor({3, 2, 4}, DType::f64).transpose(0, 1);
  testing::expect_gradients_match(
      {xt, weight}, [&](const std::vector<Tensor>& in) { return linear(in[0].transpose(0, 1), in[1]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        const Tensor strided_g = g.transpose(0, 1).contiguous().transpose(0, 1);
        const LinearGrads grads = linear_backward(in[0].transpose(0, 1), in[1], false, strided_g);
        return std::vector<Tensor>{grads.grad_x.transpose(0, 1), grads.grad_weight};
      });
}

INSTANTIATE_TEST_SUITE_P(Devices, MatmulTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

}  // namespace
}  // namespace microllm
