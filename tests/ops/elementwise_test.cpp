// Elementwise ops: contract errors, values against direct f64 computations on fresh random inputs
// (odd sizes, non-contiguous views, broadcasting), f64 finite-difference gradients, every dtype.
#include "microllm/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class ElementwiseTest : public testing::DeviceTest {};

// Direct f64 formulas, written independently of src/backend/elementwise_math.h.
double reference_unary(UnaryOp op, double x, double alpha) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1 / std::sqrt(x);
    case UnaryOp::sigmoid: return 1 / (1 + std::exp(-x));
    case UnaryOp::silu: return x / (1 + std::exp(-x));
    case UnaryOp::gelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case UnaryOp::gelu_tanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::scale: return alpha * x;
    case UnaryOp::square: return x * x;
  }
  return NAN;
}

bool needs_positive_input(UnaryOp op) {
  return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt;
}

const UnaryOp kUnaryOps[] = {
#define MICROLLM_LIST_ENTRY(name) UnaryOp::name,
    MICROLLM_UNARY_OPS(MICROLLM_LIST_ENTRY)
#undef MICROLLM_LIST_ENTRY
};
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

TEST_P(ElementwiseTest, UnaryMatchesReferenceOnEveryDtypeAndLayout) {
  for (UnaryOp op : kUnaryOps) {
    for (DType dtype : kFloatTypes) {
      const double lo = needs_positive_input(op) ? 0.1 : -3, hi = 3;
      Tensor x = random_tensor({5, 37}, dtype, device(), lo, hi);
      for (const Tensor& input : {x, testing::non_contiguous(x), x.t()}) {
        const double alpha = 0.7;
        Tensor y = unary(op, input, alpha);
        ASSERT_EQ(y.shape(), input.shape());
        ASSERT_EQ(y.dtype(), dtype);
        ASSERT_TRUE(y.is_contiguous());
        std::vector<double> ref;
        for (double v : host_values(input)) ref.push_back(reference_unary(op, v, alpha));
        MICROLLM_EXPECT_CLOSE(y, ref, tolerance(dtype)) << unary_op_name(op) << " " << dtype;
      }
    }
  }
}

TEST_P(ElementwiseTest, UnaryGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  for (UnaryOp op : kUnaryOps) {
    const double lo = needs_positive_input(op) ? 0.5 : -2;
    Tensor x = random_tensor({3, 7}, DType::f64, Device::cpu(), lo, 2);
    testing::expect_gradients_match(
        {x}, [&](const std::vector<Tensor>& in) { return unary(op, in[0], 1.3); },
        [&](const std::vector<Tensor>& in, const Tensor& g) {
          return std::vector<Tensor>{unary_backward(op, in[0], g, 1.3)};
        });
  }
}

double reference_binary(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return std::max(a, b);
    case BinaryOp::minimum: return std::min(a, b);
    case BinaryOp::eq: return a == b;
    case BinaryOp::ne: return a != b;
    case BinaryOp::lt: return a < b;
    case BinaryOp::le: return a <= b;
    case BinaryOp::gt: return a > b;
    case BinaryOp::ge: return a >= b;
  }
  return NAN;
}

const BinaryOp kBinaryOps[] = {
#define MICROLLM_LIST_ENTRY(name) BinaryOp::name,
    MICROLLM_BINARY_OPS(MICROLLM_LIST_ENTRY)
#undef MICROLLM_LIST_ENTRY
};

TEST_P(ElementwiseTest, BinaryBroadcastsAndMatchesReference) {
  for (BinaryOp op : kBinaryOps) {
    for (DType dtype : kFloatTypes) {
      // a [4, 1, 9] with b [3, 1]: out [4, 3, 9]; b is a non-contiguous view.
      Tensor a = random_tensor({4, 1, 9}, dtype, device(), 0.5, 2);
      Tensor b = testing::non_contiguous(random_tensor({3, 1}, dtype, device(), 0.5, 2));
      if (is_comparison(op)) a = a.slice(2, 0, 9).contiguous();  // values are random: ties are rare but fine
      Tensor out = binary(op, a, b);
      ASSERT_EQ(out.shape(), (Shape{4, 3, 9}));
      ASSERT_EQ(out.dtype(), is_comparison(op) ? DType::u8 : dtype);
      const std::vector<double> av = host_values(a), bv = host_values(b);
      std::vector<double> ref;
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
          for (int k = 0; k < 9; ++k) ref.push_back(reference_binary(op, av[i * 9 + k], bv[j]));
      const double tol = is_comparison(op) ? 0 : tolerance(dtype);
      MICROLLM_EXPECT_CLOSE(out, ref, tol) << binary_op_name(op) << " " << dtype;
    }
  }
}

TEST_P(ElementwiseTest, IntegerArithmeticAndComparisons) {
  Tensor a = Tensor::from_vector<int64_t>({1, -5, 7, 3000000000LL}, {4}).to(device());
  Tensor b = Tensor::from_vector<int64_t>({2, -5, 1, 1}, {4}).to(device());
  EXPECT_EQ(add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{3, -10, 8, 3000000001LL}));
  EXPECT_EQ(eq(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(gt(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_THROW(div(a, b), DTypeError);
}

TEST_P(ElementwiseTest, BinaryGradientsReduceOverBroadcastDims) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum,
                      BinaryOp::minimum}) {
    Tensor a = random_tensor({2, 1, 5}, DType::f64, Device::cpu(), 0.5, 2);
    Tensor b = random_tensor({3, 1}, DType::f64, Device::cpu(), 0.5, 2);
    testing::expect_gradients_match(
        {a, b}, [&](const std::vector<Tensor>& in) { return binary(op, in[0], in[1]); },
        [&](const std::vector<Tensor>& in, const Tensor& g) {
          auto [ga, gb] = binary_backward(op, in[0], in[1], g);
          return std::vector<Tensor>{ga, gb};
        });
  }
}

TEST_P(ElementwiseTest, WhereAndMaskedFill) {
  Tensor a = random_tensor({3, 4}, DType::f32, device());
  Tensor b = random_tensor({4}, DType::f32, device());
  Tensor cond = Tensor::from_vector<uint8_t>({1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0}, {3, 4}).to(device());
  Tensor out = where(cond, a, b);
  const auto av = host_values(a), bv = host_values(b), cv = host_values(cond);
  std::vector<double> ref;
  for (int i = 0; i < 12; ++i) ref.push_back(cv[i] ? av[i] : bv[i % 4]);
  MICROLLM_EXPECT_CLOSE(out, ref, 0.0);

  Tensor row_mask = Tensor::from_vector<uint8_t>({0, 1, 0, 1}, {4}).to(device());
  Tensor filled = masked_fill(a, row_mask, -INFINITY);
  const auto fv = host_values(filled);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(fv[i], (i % 2) ? -INFINITY : av[i]);
}

TEST_P(ElementwiseTest, WhereGradients) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  Tensor cond = Tensor::from_vector<uint8_t>({1, 0, 1, 0, 0, 1}, {2, 3});
  Tensor a = random_tensor({2, 3}, DType::f64);
  Tensor b = random_tensor({3}, DType::f64);
  testing::expect_gradients_match(
      {a, b}, [&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        auto [ga, gb] = where_backward(cond, in[0].shape(), in[1].shape(), g);
        return std::vector<Tensor>{ga, gb};
      });
}

TEST_P(ElementwiseTest, CastRoundTripsAndRoundsToNearestEven) {
  Tensor x = random_tensor({33}, DType::f32, device(), -100, 100);
  for (DType dtype : {DType::f16, DType::bf16, DType::f64, DType::f8_e4m3fn, DType::f8_e5m2}) {
    Tensor y = cast(x, dtype);
    ASSERT_EQ(y.dtype(), dtype);
    const std::vector<float> back = cast(y, DType::f32).to_vector<float>();
    const std::vector<float> xs = x.to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      float expected = xs[i];
      if (dtype == DType::f16) expected = to_float(f16_from_float(xs[i]));
      if (dtype == DType::bf16) expected = to_float(bf16_from_float(xs[i]));
      if (dtype == DType::f8_e4m3fn) expected = to_float(f8_e4m3fn_from_float(xs[i]));
      if (dtype == DType::f8_e5m2) expected = to_float(f8_e5m2_from_float(xs[i]));
      EXPECT_EQ(back[i], expected) << dtype << " at " << i;
    }
  }
}

TEST_P(ElementwiseTest, ContractErrorsNameTheOp) {
  Tensor f = random_tensor({2, 3}, DType::f32, device());
  Tensor h = random_tensor({2, 3}, DType::f16, device());
  Tensor wrong = random_tensor({4}, DType::f32, device());
  Tensor ids = Tensor::zeros({2, 3}, DType::i64, device());
  EXPECT_THROW(add(f, h), DTypeError);
  EXPECT_THROW(add(f, wrong), ShapeError);
  EXPECT_THROW(exp(ids), DTypeError);
  EXPECT_THROW(exp(Tensor()), ValueError);
  EXPECT_THROW(unary_backward(UnaryOp::exp, f, wrong), ShapeError);
  EXPECT_THROW(where(f, f, f), DTypeError);
  try {
    add(f, wrong);
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[add]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ElementwiseTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
