// RMSNorm (plain and fused with the residual add): contract errors, values against direct f64 computations
// on fresh random inputs (odd sizes, non-contiguous views), Hugging Face's roundings in bf16/f16, the
// backward against its formula on every dtype, and f64 finite-difference gradients for both forms.
#include "microllm/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "microllm/ops/elementwise.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

constexpr double kEps = 1e-6;
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

class RmsNormTest : public testing::DeviceTest {};

DType stats_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// The same values in three layouts: contiguous, every other element, and last dim outermost in memory.
std::vector<Tensor> layouts(const Tensor& t) {
  Dims to_front{t.dim() - 1}, to_back;
  for (int d = 0; d + 1 < t.dim(); ++d) to_front.push_back(d);
  for (int d = 1; d < t.dim(); ++d) to_back.push_back(d);
  to_back.push_back(0);
  return {t, testing::non_contiguous(t), t.permute(to_front).contiguous().permute(to_back)};
}

struct NormReference {
  std::vector<double> y, h, rstd;
};

// Row-major values of x (and residual) [rows, n]; everything in f64, no intermediate rounding.
NormReference reference_rms_norm(const std::vector<double>& x, const std::vector<double>* residual,
                                 const std::vector<double>& w, double eps) {
  const size_t n = w.size(), rows = x.size() / n;
  NormReference ref;
  for (size_t r = 0; r < rows; ++r) {
    double sum_sq = 0;
    for (size_t j = 0; j < n; ++j) {
      const double h = x[r * n + j] + (residual ? (*residual)[r * n + j] : 0.0);
      ref.h.push_back(h);
      sum_sq += h * h;
    }
    const double rstd = 1 / std::sqrt(sum_sq / static_cast<double>(n) + eps);
    ref.rstd.push_back(rstd);
    for (size_t j = 0; j < n; ++j) ref.y.push_back(ref.h[r * n + j] * rstd * w[j]);
  }
  return ref;
}

// d/dh of sum(g * y): grad_h[j] = rstd w[j] g[j] - h[j] rstd^3 / n * sum_k w[k] g[k] h[k]; grad_w[j] = sum_rows g h
// rstd.
std::pair<std::vector<double>, std::vector<double>> reference_backward(const std::vector<double>& g,
                                                                       const std::vector<double>& h,
                                                                       const std::vector<double>& w, double eps) {
  const size_t n = w.size(), rows = h.size() / n;
  std::vector<double> grad_h(h.size()), grad_w(n, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double sum_sq = 0, dot = 0;
    for (size_t j = 0; j < n; ++j) {
      sum_sq += h[r * n + j] * h[r * n + j];
      dot += w[j] * g[r * n + j] * h[r * n + j];
    }
    const double rstd = 1 / std::sqrt(sum_sq / static_cast<double>(n) + eps);
    for (size_t j = 0; j < n; ++j) {
      grad_h[r * n + j] = rstd * w[j] * g[r * n + j] - h[r * n + j] * rstd * rstd * rstd * dot / static_cast<double>(n);
      grad_w[j] += g[r * n + j] * h[r * n + j] * rstd;
    }
  }
  return {grad_h, grad_w};
}

TEST_P(RmsNormTest, ContractErrorsNameTheOpAndValues) {
  const Tensor x = Tensor::zeros({2, 7, 896}, DType::f32, device());
  const Tensor w = Tensor::ones({896}, DType::f32, device());
  try {
    rms_norm(x, Tensor::ones({512}, DType::f32, device()), kEps);
    ADD_FAILURE() << "a weight of the wrong size must throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[rms_norm] weight shape [512] does not match the last dim of input [2, 7, 896]");
  }
  EXPECT_THROW(rms_norm(x, Tensor::ones({1, 896}, DType::f32, device()), kEps), ShapeError);
  EXPECT_THROW(rms_norm(x, Tensor::ones({896}, DType::f16, device()), kEps), DTypeError);
  EXPECT_THROW(rms_norm(x, Tensor(), kEps), ValueError);
  EXPECT_THROW(rms_norm(Tensor(), w, kEps), ValueError);
  EXPECT_THROW(rms_norm(Tensor::zeros({2, 896}, DType::i64, device()), w, kEps), DTypeError);
  EXPECT_THROW(rms_norm(Tensor::scalar(1.0, DType::f32, device()), w, kEps), ShapeError);
  for (double eps : {0.0, -1e-6, double(NAN), double(INFINITY)}) EXPECT_THROW(rms_norm(x, w, eps), ValueError) << eps;
  try {
    rms_norm(x, w, -1);
    ADD_FAILURE() << "eps -1 must throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[rms_norm]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }

  EXPECT_THROW(rms_norm_residual(x, Tensor::zeros({2, 896}, DType::f32, device()), w, kEps), ShapeError);
  EXPECT_THROW(rms_norm_residual(x, Tensor::zeros({2, 7, 896}, DType::bf16, device()), w, kEps), DTypeError);
  EXPECT_THROW(rms_norm_residual(x, Tensor(), w, kEps), ValueError);
  try {
    rms_norm_residual(x, Tensor::zeros({2, 6, 896}, DType::f32, device()), w, kEps);
    ADD_FAILURE() << "a residual of another shape must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rms_norm] residual shape [2, 6, 896]"), std::string::npos) << e.what();
  }

  const RmsNormResult fwd = rms_norm_with_stats(x, w, kEps);
  EXPECT_NO_THROW(rms_norm_backward(x, x, w, fwd.rstd));
  EXPECT_THROW(rms_norm_backward(x, x, w, Tensor::ones({13}, DType::f32, device())), ShapeError);
  EXPECT_THROW(rms_norm_backward(x, x, w, Tensor::ones({14}, DType::f16, device())), DTypeError);
  EXPECT_THROW(rms_norm_backward(x, x, w, Tensor::ones({14}, DType::f64, device())), DTypeError);
  EXPECT_THROW(rms_norm_backward(x, x, w, Tensor()), ValueError);
  EXPECT_THROW(rms_norm_backward(x.narrow(1, 0, 6), x, w, fwd.rstd), ShapeError);
  EXPECT_THROW(rms_norm_backward(x.to(DType::bf16), x, w, fwd.rstd), DTypeError);
  try {
    rms_norm_backward(x, x, Tensor::ones({512}, DType::f32, device()), fwd.rstd);
    ADD_FAILURE() << "a weight of the wrong size must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rms_norm_backward] weight shape [512]"), std::string::npos) << e.what();
  }
}

TEST_P(RmsNormTest, MatchesReferenceOnEveryDtypeAndLayout) {
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : {Shape{3, 5, 37}, Shape{37}, Shape{4, 1}}) {
      const Tensor x = random_tensor(shape, dtype, device(), -2, 2);
      const Tensor w = random_tensor({shape.back()}, dtype, device(), -1.5, 1.5);
      const std::vector<Tensor> xs = layouts(x);
      for (size_t k = 0; k < xs.size(); ++k) {
        const Tensor weight = k == 1 ? testing::non_contiguous(w) : w;
        const RmsNormResult r = rms_norm_with_stats(xs[k], weight, kEps);
        ASSERT_EQ(r.out.shape(), shape);
        ASSERT_EQ(r.out.dtype(), dtype);
        ASSERT_TRUE(r.out.is_contiguous());
        EXPECT_FALSE(r.h.defined());
        ASSERT_EQ(r.rstd.shape(), (Shape{shape.numel() / shape.back()}));
        ASSERT_EQ(r.rstd.dtype(), stats_dtype(dtype));
        const NormReference ref = reference_rms_norm(host_values(x), nullptr, host_values(w), kEps);
        MICROLLM_EXPECT_CLOSE(r.out, ref.y, tolerance(dtype)) << dtype << " " << shape << " layout " << k;
        MICROLLM_EXPECT_CLOSE(r.rstd, ref.rstd, tolerance(stats_dtype(dtype))) << dtype << " " << shape;
        MICROLLM_EXPECT_CLOSE(rms_norm(xs[k], weight, kEps), ref.y, tolerance(dtype)) << dtype << " " << shape;
      }
    }
  }
}

TEST_P(RmsNormTest, FusedResidualMatchesReferenceOnEveryDtypeAndLayout) {
  for (DType dtype : kFloatTypes) {
    const Shape shape{3, 5, 37};
    const Tensor x = random_tensor(shape, dtype, device(), -2, 2);
    const Tensor res = random_tensor(shape, dtype, device(), -2, 2);
    const Tensor w = random_tensor({37}, dtype, device(), 0.5, 1.5);
    const NormReference ref = reference_rms_norm(host_values(x), nullptr, host_values(w), kEps);
    const std::vector<double> rv = host_values(res);
    const NormReference fused_ref = reference_rms_norm(host_values(x), &rv, host_values(w), kEps);
    const std::vector<Tensor> xs = layouts(x), rs = layouts(res);
    for (size_t k = 0; k < xs.size(); ++k) {
      const RmsNormResult r = rms_norm_residual(xs[k], rs[(k + 1) % rs.size()], w, kEps);
      ASSERT_EQ(r.h.shape(), shape);
      ASSERT_EQ(r.h.dtype(), dtype);
      MICROLLM_EXPECT_CLOSE(r.h, fused_ref.h, tolerance(dtype)) << dtype << " layout " << k;
      MICROLLM_EXPECT_CLOSE(r.out, fused_ref.y, tolerance(dtype)) << dtype << " layout " << k;
      // The statistics are those of h as stored (rounded to the dtype), as in HF's residual stream.
      const NormReference of_stored_h = reference_rms_norm(host_values(r.h), nullptr, host_values(w), kEps);
      MICROLLM_EXPECT_CLOSE(r.rstd, of_stored_h.rstd, tolerance(stats_dtype(dtype))) << dtype << " layout " << k;
      MICROLLM_EXPECT_CLOSE(r.out, of_stored_h.y, tolerance(dtype)) << dtype << " layout " << k;
      // h is x + residual rounded once to the dtype, as the elementwise add stores it.
      EXPECT_EQ(host_values(r.h), host_values(add(xs[k], rs[(k + 1) % rs.size()]))) << dtype;
    }
    // Without a residual the result differs: the residual really is added.
    EXPECT_GT(testing::relative_error(rms_norm(x, w, kEps), fused_ref.y), 10 * tolerance(dtype)) << dtype;
    MICROLLM_EXPECT_CLOSE(rms_norm(x, w, kEps), ref.y, tolerance(dtype)) << dtype;
  }
}

// HF's Qwen2RMSNorm: y = weight * (h * rstd).to(dtype), h = (x + residual) stored in the dtype, so the
// normalized value is rounded before the weight multiplies it. Emulated here with explicit roundings.
TEST_P(RmsNormTest, HalfTypesRoundLikeHuggingFace) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    auto round = [&](double v) {
      const auto f = static_cast<float>(v);
      return static_cast<double>(dtype == DType::bf16 ? to_float(bf16_from_float(f)) : to_float(f16_from_float(f)));
    };
    const int64_t rows = 16, n = 64;
    const Tensor x = random_tensor({rows, n}, dtype, device(), -3, 3);
    const Tensor res = random_tensor({rows, n}, dtype, device(), -3, 3);
    const Tensor w = random_tensor({n}, dtype, device(), 0.3, 3);
    const RmsNormResult r = rms_norm_residual(x, res, w, kEps);
    const std::vector<double> xv = host_values(x), rv = host_values(res), wv = host_values(w), got = host_values(r.out);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<double> h(n);
      double sum_sq = 0;
      for (int64_t j = 0; j < n; ++j) {
        h[j] = round(xv[i * n + j] + rv[i * n + j]);
        sum_sq += h[j] * h[j];
      }
      const float rstd = static_cast<float>(1 / std::sqrt(sum_sq / n + kEps));
      for (int64_t j = 0; j < n; ++j) {
        const double expected = round(wv[j] * round(static_cast<float>(h[j]) * rstd));
        const double got_v = got[i * n + j];
        if (got_v != expected) ++mismatches;
        // f32 statistics may differ in the last bit from this f64 sum, which can move the inner rounding one
        // step and the outer one two: a bound of two steps of the dtype.
        EXPECT_LE(std::abs(got_v - expected), std::abs(expected) * (dtype == DType::bf16 ? 2.0 / 128 : 2.0 / 1024))
            << dtype << " at " << i << ", " << j;
      }
    }
    EXPECT_LE(mismatches, rows * n / 100) << dtype << ": outputs that differ from HF's roundings";
  }
}

TEST_P(RmsNormTest, BackwardMatchesFormulaOnEveryDtypeAndLayout) {
  for (DType dtype : kFloatTypes) {
    const Shape shape{3, 5, 37};
    const Tensor h = random_tensor(shape, dtype, device(), -2, 2);
    const Tensor g = random_tensor(shape, dtype, device(), -1, 1);
    const Tensor w = random_tensor({37}, dtype, device(), -1.5, 1.5);
    const Tensor rstd = rms_norm_with_stats(h, w, kEps).rstd;
    const auto [ref_h, ref_w] = reference_backward(host_values(g), host_values(h), host_values(w), kEps);
    const std::vector<Tensor> hs = layouts(h), gs = layouts(g);
    for (size_t k = 0; k < hs.size(); ++k) {
      const RmsNormGrads grads =
          rms_norm_backward(gs[(k + 2) % gs.size()], hs[k], k == 1 ? testing::non_contiguous(w) : w, rstd);
      ASSERT_EQ(grads.grad_h.shape(), shape);
      ASSERT_EQ(grads.grad_h.dtype(), dtype);
      ASSERT_EQ(grads.grad_weight.shape(), (Shape{37}));
      ASSERT_EQ(grads.grad_weight.dtype(), dtype);
      MICROLLM_EXPECT_CLOSE(grads.grad_h, ref_h, tolerance(dtype)) << dtype << " layout " << k;
      MICROLLM_EXPECT_CLOSE(grads.grad_weight, ref_w, tolerance(dtype)) << dtype << " layout " << k;
    }
  }
}

// Enough rows and columns that the row loop and the column loop of grad_w both split across threads.
TEST_P(RmsNormTest, ManyRowsMatchReference) {
  const Shape shape{70, 1000};
  const Tensor x = testing::non_contiguous(random_tensor(shape, DType::f32, device(), -2, 2));
  const Tensor res = random_tensor(shape, DType::f32, device(), -2, 2);
  const Tensor g = random_tensor(shape, DType::f32, device());
  const Tensor w = random_tensor({1000}, DType::f32, device(), 0.5, 1.5);
  const std::vector<double> rv = host_values(res);
  const NormReference ref = reference_rms_norm(host_values(x), &rv, host_values(w), kEps);
  const RmsNormResult r = rms_norm_residual(x, res, w, kEps);
  MICROLLM_EXPECT_CLOSE(r.out, ref.y, tolerance(DType::f32));
  const auto [ref_h, ref_w] = reference_backward(host_values(g), ref.h, host_values(w), kEps);
  const RmsNormGrads grads = rms_norm_backward(g, r.h, w, r.rstd);
  MICROLLM_EXPECT_CLOSE(grads.grad_h, ref_h, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(grads.grad_weight, ref_w, tolerance(DType::f32));
}

TEST_P(RmsNormTest, EmptyBatchGivesEmptyOutputs) {
  const Tensor x = Tensor::zeros({0, 8}, DType::f32, device());
  const Tensor w = Tensor::ones({8}, DType::f32, device());
  const RmsNormResult r = rms_norm_residual(x, x, w, kEps);
  EXPECT_EQ(r.out.shape(), (Shape{0, 8}));
  EXPECT_EQ(r.rstd.shape(), (Shape{0}));
  const RmsNormGrads grads = rms_norm_backward(x, r.h, w, r.rstd);
  EXPECT_EQ(grads.grad_h.shape(), (Shape{0, 8}));
  EXPECT_EQ(host_values(grads.grad_weight), std::vector<double>(8, 0.0));  // a sum over no rows
}

TEST_P(RmsNormTest, GradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  for (const Shape& shape : {Shape{3, 11}, Shape{2, 3, 5}}) {
    const Tensor x = random_tensor(shape, DType::f64);
    const Tensor w = random_tensor({shape.back()}, DType::f64, Device::cpu(), 0.5, 1.5);
    testing::expect_gradients_match(
        {x, w}, [](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], kEps); },
        [](const std::vector<Tensor>& in, const Tensor& g) {
          const RmsNormResult fwd = rms_norm_with_stats(in[0], in[1], kEps);
          const RmsNormGrads grads = rms_norm_backward(g, in[0], in[1], fwd.rstd);
          return std::vector<Tensor>{grads.grad_h, grads.grad_weight};
        });
  }
}

// The fused form must not lose gradients: they reach x, residual and weight, through y and through h.
TEST_P(RmsNormTest, FusedGradientsReachInputResidualAndWeight) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor x = random_tensor({3, 13}, DType::f64);
  const Tensor res = random_tensor({3, 13}, DType::f64);
  const Tensor w = random_tensor({13}, DType::f64, Device::cpu(), 0.5, 1.5);
  auto backward = [](const std::vector<Tensor>& in, const Tensor& g) {
    const RmsNormResult fwd = rms_norm_residual(in[0], in[1], in[2], kEps);
    const RmsNormGrads grads = rms_norm_backward(g, fwd.h, in[2], fwd.rstd);
    // d h / d x = d h / d residual = 1
    return std::vector<Tensor>{grads.grad_h, grads.grad_h, grads.grad_weight};
  };
  const std::vector<Tensor> grads = backward({x, res, w}, Tensor::ones({3, 13}, DType::f64));
  for (const Tensor& grad : grads) {
    ASSERT_TRUE(grad.defined());
    EXPECT_GT(testing::relative_error(grad, std::vector<double>(grad.numel(), 0.0)), 0.0);
  }
  testing::expect_gradients_match(
      {x, res, w}, [](const std::vector<Tensor>& in) { return rms_norm_residual(in[0], in[1], in[2], kEps).out; },
      backward);
  // A decoder layer also carries h on as the residual stream: L = sum((y + h) * R).
  testing::expect_gradients_match(
      {x, res, w},
      [](const std::vector<Tensor>& in) {
        const RmsNormResult fwd = rms_norm_residual(in[0], in[1], in[2], kEps);
        return add(fwd.out, fwd.h);
      },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        std::vector<Tensor> through_y = backward(in, g);
        const Tensor grad_h = add(through_y[0], g);
        return std::vector<Tensor>{grad_h, grad_h, through_y[2]};
      });
}

INSTANTIATE_TEST_SUITE_P(Devices, RmsNormTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

}  // namespace
}  // namespace microllm
