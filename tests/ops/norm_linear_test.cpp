// rms_norm_linear (ops/norm_linear.h): against the separate ops it folds (rms_norm(_residual), linear,
// swiglu) on fresh random inputs, on every device (CUDA: its decode GEMV at m <= 8, the composition above),
// with and without a residual, a bias and SwiGLU; and the contract errors naming the op and the operand.
#include "microllm/ops/norm_linear.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "microllm/ops/activation.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/norm.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

constexpr double kEps = 1e-6;

class NormLinearTest : public testing::DeviceTest {};

// The composition rms_norm_linear stands for, with the separate ops on the CPU.
NormLinearResult composed(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& w,
                          const Tensor& bias, bool swiglu) {
  NormLinearResult r;
  Tensor normed = x;
  if (residual.defined()) {
    const RmsNormResult n = rms_norm_residual(x, residual, gamma, kEps);
    normed = n.out;
    r.h = n.h;
  } else {
    normed = rms_norm(x, gamma, kEps);
    r.h = x;
  }
  const Tensor y = linear(normed, w, bias);
  const int64_t n = w.size(0) / 2;
  r.out = swiglu ? microllm::swiglu(y.narrow(-1, 0, n), y.narrow(-1, n, n)) : y;
  return r;
}

TEST_P(NormLinearTest, EqualsTheSeparateOps) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t rows : {1, 3, 8, 19}) {  // 19: past CUDA's GEMV, the composition there too
      for (bool with_residual : {false, true}) {
        for (bool swiglu : {false, true}) {
          const bool with_bias = !swiglu && rows % 2 == 1;
          SCOPED_TRACE(str_cat(dtype_name(dtype), " rows ", rows, with_residual ? " residual" : "",
                               swiglu ? " swiglu" : "", with_bias ? " bias" : ""));
          const int64_t k = 200, n = swiglu ? 2 * 136 : 136;
          // [1, rows, k]: the model's [B, T, hidden]
          const Tensor x = random_tensor({1, rows, k}, dtype), gamma = random_tensor({k}, dtype, Device::cpu(), 0.5, 1.5);
          const Tensor residual = with_residual ? random_tensor({1, rows, k}, dtype) : Tensor();
          const Tensor w = random_tensor({n, k}, dtype, Device::cpu(), -0.1, 0.1);
          const Tensor bias = with_bias ? random_tensor({n}, dtype) : Tensor();
          const NormLinearResult want = composed(x, residual, gamma, w, bias, swiglu);
          auto on = [&](const Tensor& t) { return t.defined() ? t.to(device()) : Tensor(); };
          const NormLinearResult got =
              rms_norm_linear(on(x), on(residual), on(gamma), kEps, on(w), on(bias), swiglu);
          ASSERT_EQ(got.out.shape(), want.out.shape());
          EXPECT_LE(testing::relative_error(got.out.to(Device::cpu()), want.out), testing::tolerance(dtype));
          ASSERT_EQ(got.h.shape(), x.shape());
          // h is one rounded add: the same bits everywhere.
          EXPECT_EQ(testing::host_values(got.h.to(Device::cpu())), testing::host_values(want.h));
        }
      }
    }
  }
}

TEST_P(NormLinearTest, ContractErrorsNameTheOpAndOperand) {
  const Device d = device();
  const Tensor x = random_tensor({2, 16}, DType::f32, d), gamma = random_tensor({16}, DType::f32, d);
  const Tensor w = random_tensor({6, 16}, DType::f32, d);
  auto rand = [&](const Shape& s) { return random_tensor(s, DType::f32, d); };
  // Each call's error names the op and the words given.
  auto expect_error = [](const std::function<void()>& call, const std::string& words) {
    const std::string message = testing::message_of<Error>(call);
    EXPECT_NE(message.find("rms_norm_linear"), std::string::npos) << message;
    EXPECT_NE(message.find(words), std::string::npos) << "wanted \"" << words << "\" in: " << message;
  };
  expect_error([&] { rms_norm_linear(x, Tensor(), rand({15}), kEps, w, Tensor(), false); }, "norm weight shape");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, rand({6, 8}), Tensor(), false); }, "weight shape");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, rand({5, 16}), Tensor(), true); }, "even row count");
  expect_error([&] { rms_norm_linear(x, rand({3, 16}), gamma, kEps, w, Tensor(), false); }, "residual");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, w.to(DType::bf16), Tensor(), false); }, "weight");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, w, rand({5}), false); }, "bias shape");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, 0.0, w, Tensor(), false); }, "eps");
}

INSTANTIATE_TEST_SUITE_P(Devices, NormLinearTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
