// Reductions: sum/mean/max over one dim, several dims and all; keepdim; argmax (first max, NaN wins);
// integer sums; empty dims; contract errors; f64 finite-difference gradients.
#include "microllm/ops/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class ReduceTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

enum class Op { sum, mean, max };
const char* op_name(Op op) { return op == Op::sum ? "sum" : op == Op::mean ? "mean" : "max"; }

std::vector<int64_t> index_of(int64_t flat, const Shape& shape) {
  std::vector<int64_t> i(static_cast<size_t>(shape.size()));
  for (int d = shape.size() - 1; d >= 0; --d) {
    i[static_cast<size_t>(d)] = flat % shape[d];
    flat /= shape[d];
  }
  return i;
}

// Reduces the (normalized) dims of row-major `values` with f64 loops; the result is row-major over the
// input shape with the reduced dims set to 1 (the keepdim shape; dropping size-1 dims keeps the order).
std::vector<double> reference_reduce(const std::vector<double>& values, const Shape& shape, const std::set<int>& dims,
                                     Op op) {
  Shape out_shape = shape;
  for (int d : dims) out_shape[d] = 1;
  const int64_t out_count = out_shape.numel();
  std::vector<double> out(static_cast<size_t>(out_count), op == Op::max ? -INFINITY : 0.0);
  std::vector<int64_t> counts(static_cast<size_t>(out_count), 0);
  for (int64_t flat = 0; flat < shape.numel(); ++flat) {
    std::vector<int64_t> i = index_of(flat, shape);
    int64_t o = 0;
    for (int d = 0; d < shape.size(); ++d) o = o * out_shape[d] + (dims.count(d) ? 0 : i[static_cast<size_t>(d)]);
    const double v = values[static_cast<size_t>(flat)];
    double& acc = out[static_cast<size_t>(o)];
    if (op == Op::max) {
      if (std::isnan(v) || v > acc) acc = std::isnan(acc) ? acc : v;
    } else {
      acc += v;
    }
    ++counts[static_cast<size_t>(o)];
  }
  if (op == Op::mean) {
    for (size_t k = 0; k < out.size(); ++k) out[k] /= static_cast<double>(counts[k]);
  }
  return out;
}

Shape reduced_shape(const Shape& shape, const std::set<int>& dims, bool keepdim) {
  Shape out;
  for (int d = 0; d < shape.size(); ++d) {
    if (!dims.count(d))
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

std::set<int> normalized(const Dims& dims, int rank) {
  std::set<int> out;
  if (dims.empty()) {
    for (int d = 0; d < rank; ++d) out.insert(d);
  }
  for (int64_t d : dims) out.insert(static_cast<int>(d < 0 ? d + rank : d));
  return out;
}

Tensor run(Op op, const Tensor& x, const Dims& dims, bool keepdim) {
  switch (op) {
    case Op::sum: return sum(x, dims, keepdim);
    case Op::mean: return mean(x, dims, keepdim);
    case Op::max: return max(x, dims[0], keepdim);
  }
  return Tensor();
}

// The layouts every value test runs on: contiguous, every other element of a wider buffer, permuted.
std::vector<Tensor> layouts(const Tensor& x) {
  return {x, testing::non_contiguous(x), x.permute({2, 0, 1}), x.transpose(0, 1)};
}

TEST_P(ReduceTest, OneDimMatchesReference) {
  for (DType dtype : kFloatTypes) {
    const Tensor x = random_tensor({3, 5, 7}, dtype, device(), -2, 2);
    for (const Tensor& input : layouts(x)) {
      const std::vector<double> values = host_values(input);
      for (Op op : {Op::sum, Op::mean, Op::max}) {
        for (int64_t dim = -3; dim < 3; ++dim) {
          for (bool keepdim : {false, true}) {
            const std::set<int> dims = normalized(Dims{dim}, 3);
            const Tensor out = run(op, input, Dims{dim}, keepdim);
            ASSERT_EQ(out.shape(), reduced_shape(input.shape(), dims, keepdim)) << op_name(op) << " dim " << dim;
            ASSERT_EQ(out.dtype(), dtype);
            const double tol = op == Op::max ? 0.0 : tolerance(dtype);
            MICROLLM_EXPECT_CLOSE(out, reference_reduce(values, input.shape(), dims, op), tol)
                << op_name(op) << " " << dtype << " dim " << dim << " keepdim " << keepdim << " input " << input.shape()
                << " strides " << input.strides();
          }
        }
      }
    }
  }
}

TEST_P(ReduceTest, SeveralDimsAndAllMatchReference) {
  const Dims cases[] = {Dims{0, 2}, Dims{-1, 0}, Dims{1, 2}, Dims{2, 1, 0}, Dims{0, 1}, Dims{}};
  for (DType dtype : kFloatTypes) {
    // Shifted away from zero: a sum of 135 signed values can cancel to near zero, where any relative bound
    // on an f32 sum fails by luck of the seed (the error bound of summation is relative to sum |x|).
    const Tensor x = random_tensor({5, 3, 9}, dtype, device(), -1, 3);
    for (const Tensor& input : {x, testing::non_contiguous(x), x.transpose(0, 2)}) {
      const std::vector<double> values = host_values(input);
      for (Op op : {Op::sum, Op::mean}) {
        for (const Dims& dims : cases) {
          for (bool keepdim : {false, true}) {
            const std::set<int> set = normalized(dims, 3);
            const Tensor out = op == Op::sum ? sum(input, dims, keepdim) : mean(input, dims, keepdim);
            ASSERT_EQ(out.shape(), reduced_shape(input.shape(), set, keepdim)) << dims;
            MICROLLM_EXPECT_CLOSE(out, reference_reduce(values, input.shape(), set, op), tolerance(dtype))
                << op_name(op) << " " << dtype << " dims " << dims << " keepdim " << keepdim;
          }
        }
      }
      // The all-element overloads give rank 0.
      const std::set<int> all{0, 1, 2};
      const Tensor s = sum(input), m = mean(input), mx = max(input);
      ASSERT_EQ(s.dim(), 0);
      ASSERT_EQ(mx.dim(), 0);
      MICROLLM_EXPECT_CLOSE(s, reference_reduce(values, input.shape(), all, Op::sum), tolerance(dtype));
      MICROLLM_EXPECT_CLOSE(m, reference_reduce(values, input.shape(), all, Op::mean), tolerance(dtype));
      MICROLLM_EXPECT_CLOSE(mx, reference_reduce(values, input.shape(), all, Op::max), 0.0);
    }
  }
}

TEST_P(ReduceTest, NarrowDtypesAccumulateOnceInF32) {
  // Over several dims the partial sums must not be rounded to the input dtype: 1 + 2^-8 + 2^-8 is
  // exactly a bf16 value, but each half of it alone rounds down to 1.
  const float tiny = std::ldexp(1.0f, -8);
  const Tensor x = Tensor::from_vector<float>({1, tiny, 0, tiny, 0, 0}, {2, 3}).to(device(), DType::bf16);
  EXPECT_EQ(sum(x).item<float>(), 1.0f + 2 * tiny);
  EXPECT_EQ(sum(x, {0, 1}).item<float>(), 1.0f + 2 * tiny);
  EXPECT_EQ(sum(x, {1, 0}, true).item<float>(), 1.0f + 2 * tiny);
  // Rows whose large sums cancel: a rounded partial sum would lose the small total.
  std::vector<float> rows(2000);
  for (int i = 0; i < 1000; ++i) {
    rows[static_cast<size_t>(i)] = to_float(f16_from_float(1.001f));
    rows[static_cast<size_t>(1000 + i)] = -1.0f;
  }
  const Tensor y = Tensor::from_vector<float>(rows, {2, 1000}).to(device(), DType::f16);
  const double exact = 1000.0 * to_float(f16_from_float(1.001f)) - 1000.0;
  MICROLLM_EXPECT_CLOSE(sum(y), std::vector<double>{exact}, tolerance(DType::f16));
  MICROLLM_EXPECT_CLOSE(mean(y), std::vector<double>{exact / 2000}, tolerance(DType::f16));
}

TEST_P(ReduceTest, IntegerSumsAndMaxAreExact) {
  for (DType dtype : {DType::i32, DType::i64, DType::i8, DType::u8}) {
    // Sums keep the input dtype, so the values stay small enough for 15 of them to fit in i8 / u8.
    const double lo = dtype == DType::u8 ? 0 : dtype == DType::i8 ? -8 : -1000;
    const double hi = dtype == DType::u8 ? 15 : dtype == DType::i8 ? 8 : 1000;
    const Tensor x = random_tensor({3, 5}, dtype, device(), lo, hi);
    const std::vector<double> values = host_values(x);
    for (const Tensor& input : {x, x.t()}) {
      const std::vector<double> v = host_values(input);
      const Tensor s = sum(input, {1});
      ASSERT_EQ(s.dtype(), DType::i64);  // integer sums return i64, as in PyTorch
      EXPECT_EQ(host_values(s), reference_reduce(v, input.shape(), {1}, Op::sum)) << dtype;
      EXPECT_EQ(host_values(max(input, 0)), reference_reduce(v, input.shape(), {0}, Op::max)) << dtype;
      EXPECT_EQ(host_values(argmax(input, 1)).size(), static_cast<size_t>(input.size(0)));
    }
    EXPECT_EQ(host_values(sum(x))[0], reference_reduce(values, x.shape(), {0, 1}, Op::sum)[0]) << dtype;
    EXPECT_THROW(mean(x), DTypeError);
  }
  // Integer sums accumulate in i64 and return i64: a u8 sum does not wrap (over several dims too).
  const Tensor bytes = Tensor::from_vector<uint8_t>({200, 100, 250, 10}, {2, 2}).to(device());
  EXPECT_EQ(sum(bytes, {1}).to_vector<int64_t>(), (std::vector<int64_t>{300, 260}));
  EXPECT_EQ(sum(bytes).item<int64_t>(), 560);
  EXPECT_THROW(sum(bytes, {1, -1}), ValueError);  // a dim named twice
  // i64 sums beyond 2^53 stay exact.
  const Tensor big = Tensor::from_vector<int64_t>({(int64_t{1} << 60) + 1, 1, -3}, {3}).to(device());
  EXPECT_EQ(sum(big).item<int64_t>(), (int64_t{1} << 60) - 1);
}

TEST_P(ReduceTest, ArgmaxTakesTheFirstMaximumAndNaN) {
  auto f = [&](std::vector<float> v, Shape shape) { return Tensor::from_vector<float>(v, shape).to(device()); };
  EXPECT_EQ(argmax(f({1, 3, 3, 2}, {4})).item<int64_t>(), 1);
  EXPECT_EQ(argmax(f({1, NAN, 5, NAN}, {4})).item<int64_t>(), 1);
  EXPECT_EQ(argmax(f({NAN, 2, NAN}, {3})).item<int64_t>(), 0);
  EXPECT_EQ(argmax(f({-INFINITY, -INFINITY}, {2})).item<int64_t>(), 0);
  EXPECT_EQ(argmax(f({1, 9, 9, NAN}, {2, 2})).item<int64_t>(), 3);  // the flattened index
  EXPECT_EQ(argmax(f({1, 9, 9, 0}, {2, 2})).item<int64_t>(), 1);
  EXPECT_EQ(argmax(f({4}, {})).item<int64_t>(), 0);
  const Tensor m = f({1, 7, 7, 2, 5, 5, NAN, 0, 9, 9, 9, 9}, {3, 4});
  EXPECT_EQ(argmax(m, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(argmax(m, 0).to_vector<int64_t>(), (std::vector<int64_t>{2, 2, 1, 2}));
  EXPECT_EQ(argmax(m, -1, true).shape(), (Shape{3, 1}));
  EXPECT_EQ(argmax(m, 0).dtype(), DType::i64);
  EXPECT_TRUE(std::isnan(max(m, 1).to_vector<float>()[1]));
  EXPECT_TRUE(std::isnan(max(m).item<float>()));
  EXPECT_EQ(max(m, 1).to_vector<float>()[2], 9.0f);
  EXPECT_TRUE(std::isnan(max(f({NAN, 1, 2}, {3})).item<float>()));  // NaN first
  // Random inputs, every dim and layout, against a first-max reference.
  for (DType dtype : kFloatTypes) {
    const Tensor x = random_tensor({4, 6, 5}, dtype, device(), -3, 3);
    for (const Tensor& input : layouts(x)) {
      const std::vector<double> v = host_values(input);
      for (int dim = 0; dim < 3; ++dim) {
        const Tensor got = argmax(input, dim, true);
        std::vector<double> want(static_cast<size_t>(got.numel()), -1);
        std::vector<double> best(static_cast<size_t>(got.numel()), -INFINITY);
        for (int64_t flat = 0; flat < input.numel(); ++flat) {
          const std::vector<int64_t> i = index_of(flat, input.shape());
          int64_t o = 0;
          for (int d = 0; d < 3; ++d) o = o * got.size(d) + (d == dim ? 0 : i[static_cast<size_t>(d)]);
          if (v[static_cast<size_t>(flat)] > best[static_cast<size_t>(o)]) {
            best[static_cast<size_t>(o)] = v[static_cast<size_t>(flat)];
            want[static_cast<size_t>(o)] = static_cast<double>(i[static_cast<size_t>(dim)]);
          }
        }
        EXPECT_EQ(host_values(got), want) << dtype << " dim " << dim << " strides " << input.strides();
      }
      const std::vector<double>::const_iterator top = std::max_element(v.begin(), v.end());
      EXPECT_EQ(argmax(input).item<int64_t>(), top - v.begin()) << dtype;
    }
  }
}

TEST_P(ReduceTest, EmptyDims) {
  const Tensor x = Tensor::zeros({3, 0}, DType::f32, device());
  EXPECT_EQ(sum(x, {1}).shape(), (Shape{3}));
  EXPECT_EQ(sum(x, {1}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(sum(x, {0}).shape(), (Shape{0}));
  EXPECT_EQ(sum(x).item<float>(), 0.0f);
  EXPECT_EQ(sum(x, {1}, true).shape(), (Shape{3, 1}));
  for (float v : mean(x, {1}).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(max(x, 0).shape(), (Shape{0}));
  for (const auto& call : std::vector<std::function<void()>>{[&] { max(x, 1); }, [&] { max(x); }, [&] { argmax(x, 1); },
                                                             [&] { argmax(x); }}) {
    try {
      call();
      ADD_FAILURE() << "reducing an empty dim did not throw";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
    }
  }
}

TEST_P(ReduceTest, ContractErrorsNameTheOp) {
  const Tensor x = random_tensor({2, 3}, DType::f32, device());
  testing::expect_op_error([&] { sum(x, {2}); }, "sum");
  testing::expect_op_error([&] { mean(x, {-3}); }, "mean");
  testing::expect_op_error([&] { max(x, 5); }, "max");
  testing::expect_op_error([&] { argmax(x, 2); }, "argmax");
  testing::expect_op_error([&] { sum(Tensor()); }, "sum");
  testing::expect_op_error([&] { mean(Tensor::zeros({2}, DType::i32, device())); }, "mean");
  testing::expect_op_error([&] { sum(Tensor::zeros({2}, DType::f8_e4m3fn, device())); }, "sum");
  EXPECT_THROW(sum(x, {2}), IndexError);
  EXPECT_THROW(mean(Tensor::zeros({2}, DType::i64, device())), DTypeError);
  EXPECT_THROW(sum(Tensor::zeros({2}, DType::f8_e5m2, device())), NotSupportedError);
}

// ---- gradients ----

TEST_P(ReduceTest, SumAndMeanGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor x = random_tensor({3, 4, 5}, DType::f64);
  for (const Dims& dims : {Dims{1}, Dims{-1}, Dims{0, 2}, Dims{2, 0, 1}, Dims{}}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(dims.str() + (keepdim ? " keepdim" : ""));
      testing::expect_gradients_match(
          {x}, [&](const std::vector<Tensor>& in) { return sum(in[0], dims, keepdim); },
          [&](const std::vector<Tensor>& in, const Tensor& g) {
            return std::vector<Tensor>{sum_backward(g, in[0].shape(), dims, keepdim)};
          });
      testing::expect_gradients_match(
          {x}, [&](const std::vector<Tensor>& in) { return mean(in[0], dims, keepdim); },
          [&](const std::vector<Tensor>& in, const Tensor& g) {
            return std::vector<Tensor>{mean_backward(g, in[0].shape(), dims, keepdim)};
          });
    }
  }
}

TEST_P(ReduceTest, MaxGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor x = random_tensor({3, 4, 5}, DType::f64);  // distinct values: max is differentiable
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(std::to_string(dim) + (keepdim ? " keepdim" : ""));
      testing::expect_gradients_match(
          {x}, [&](const std::vector<Tensor>& in) { return max(in[0], dim, keepdim); },
          [&](const std::vector<Tensor>& in, const Tensor& g) {
            return std::vector<Tensor>{max_backward(g, in[0], dim, keepdim)};
          });
    }
  }
  testing::expect_gradients_match(
      {x}, [&](const std::vector<Tensor>& in) { return max(in[0]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) { return std::vector<Tensor>{max_backward(g, in[0])}; });
  // A permuted (non-contiguous) input.
  testing::expect_gradients_match(
      {x},
      [&](const std::vector<Tensor>& in) {
        return max(in[0].permute({2, 0, 1}), 1);
      },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        return std::vector<Tensor>{max_backward(g, in[0].permute({2, 0, 1}), 1, false).permute({1, 2, 0})};
      });
}

TEST_P(ReduceTest, MaxGradientGoesToTheFirstMaximum) {
  const Tensor x = Tensor::from_vector<float>({1, 3, 3, 2, 5, 5}, {2, 3}).to(device());
  const Tensor g = Tensor::from_vector<float>({10, 20}, {2}).to(device());
  EXPECT_EQ(max_backward(g, x, 1, false).to_vector<float>(), (std::vector<float>{0, 10, 0, 0, 20, 0}));
  EXPECT_EQ(max_backward(g.view({2, 1}), x, -1, true).to_vector<float>(), (std::vector<float>{0, 10, 0, 0, 20, 0}));
  EXPECT_EQ(max_backward(Tensor::scalar(7, DType::f32, device()), x).to_vector<float>(),
            (std::vector<float>{0, 0, 0, 0, 7, 0}));
  // sum_backward broadcasts; mean_backward also divides by the count.
  EXPECT_EQ(sum_backward(g, {2, 3}, {1}, false).to_vector<float>(), (std::vector<float>{10, 10, 10, 20, 20, 20}));
  EXPECT_EQ(mean_backward(g.view({2, 1}), {2, 4}, {1}, true).to_vector<float>(),
            (std::vector<float>{2.5, 2.5, 2.5, 2.5, 5, 5, 5, 5}));
  EXPECT_EQ(sum_backward(Tensor::scalar(2, DType::f32, device()), {2, 2}, {}, false).to_vector<float>(),
            (std::vector<float>{2, 2, 2, 2}));
}

INSTANTIATE_TEST_SUITE_P(Devices, ReduceTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

}  // namespace
}  // namespace microllm
