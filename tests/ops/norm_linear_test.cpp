// rms_norm_linear (ops/norm_linear.h): against the separate ops it folds (rms_norm(_residual), linear,
// the gate's ops) on fresh random inputs, on every device (CUDA: its decode GEMV at m <= 2, the composition above),
// with and without a residual, a bias, x's own norm and each gate; and the contract errors naming the op and the
// operand.
#include "microllm/ops/norm_linear.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "microllm/ops/activation.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/norm.h"
#include "microllm/ops/qk_norm.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

constexpr double kEps = 1e-6;

class NormLinearTest : public testing::DeviceTest {};

// The composition rms_norm_linear stands for, with the separate ops on the CPU.
NormLinearResult composed(const Tensor& x, const Tensor& x_gamma, const Tensor& residual, const Tensor& gamma,
                          const Tensor& w, const Tensor& bias, GatedActivation gate) {
  NormLinearResult r;
  const Tensor input = x_gamma.defined() ? rms_norm(x, x_gamma, kEps) : x;
  Tensor normed;
  if (residual.defined()) {
    const RmsNormResult n = rms_norm_residual(input, residual, gamma, kEps);
    normed = n.out;
    r.h = n.h;
  } else {
    normed = rms_norm(input, gamma, kEps);
    r.h = input;
  }
  const Tensor y = linear(normed, w, bias);
  const int64_t n = w.size(0) / 2;
  switch (gate) {
    case GatedActivation::none: r.out = y; break;
    case GatedActivation::swiglu: r.out = microllm::swiglu(y.narrow(-1, 0, n), y.narrow(-1, n, n)); break;
    case GatedActivation::geglu: r.out = mul(gelu(y.narrow(-1, 0, n), /*tanh_approximation=*/true), y.narrow(-1, n, n));
  }
  return r;
}

TEST_P(NormLinearTest, EqualsTheSeparateOps) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t rows : {1, 2, 3, 8, 19}) {  // 19: past CUDA's GEMV, the composition there too
      for (bool with_residual : {false, true}) {
        for (GatedActivation gate : {GatedActivation::none, GatedActivation::swiglu, GatedActivation::geglu}) {
          for (bool x_normed : {false, true}) {  // a sandwich block's sublayer output, normalized before its add
            const bool gated = gate != GatedActivation::none;
            const bool with_bias = !gated && rows % 2 == 1;
            SCOPED_TRACE(str_cat(dtype_name(dtype), " rows ", rows, with_residual ? " residual" : "", " gate ",
                                 gated_activation_name(gate), with_bias ? " bias" : "", x_normed ? " x normed" : ""));
            const int64_t k = 200, n = gated ? 2 * 136 : 136;
            // [1, rows, k]: the model's [B, T, hidden]
            const Tensor x = random_tensor({1, rows, k}, dtype);
            const Tensor gamma = random_tensor({k}, dtype, Device::cpu(), 0.5, 1.5);
            const Tensor x_gamma = x_normed ? random_tensor({k}, dtype, Device::cpu(), 0.5, 1.5) : Tensor();
            const Tensor residual = with_residual ? random_tensor({1, rows, k}, dtype) : Tensor();
            const Tensor w = random_tensor({n, k}, dtype, Device::cpu(), -0.1, 0.1);
            const Tensor bias = with_bias ? random_tensor({n}, dtype) : Tensor();
            const NormLinearResult want = composed(x, x_gamma, residual, gamma, w, bias, gate);
            auto on = [&](const Tensor& t) { return t.defined() ? t.to(device()) : Tensor(); };
            const NormLinearResult got =
                rms_norm_linear(on(x), on(residual), on(gamma), kEps, on(w), on(bias), gate, on(x_gamma));
            ASSERT_EQ(got.out.shape(), want.out.shape());
            EXPECT_LE(testing::relative_error(got.out.to(Device::cpu()), want.out), testing::tolerance(dtype));
            ASSERT_EQ(got.h.shape(), x.shape());
            if (x_normed) {  // x's own norm sums its squares in the kernel's order
              EXPECT_LE(testing::relative_error(got.h.to(Device::cpu()), want.h), testing::tolerance(dtype));
            } else {  // h is one rounded add: the same bits everywhere
              EXPECT_EQ(testing::host_values(got.h.to(Device::cpu())), testing::host_values(want.h));
            }
            // Past the folded GEMV's rows the fusion is its composition on this device (CUDA: a sandwich block's two
            // norms in one kernel), bit for bit; swiglu's Hopper GEMM aside.
            if (rows > 2 && gate != GatedActivation::swiglu) {
              const NormLinearResult here =
                  composed(on(x), on(x_gamma), on(residual), on(gamma), on(w), on(bias), gate);
              EXPECT_EQ(testing::host_values(got.out), testing::host_values(here.out));
              EXPECT_EQ(testing::host_values(got.h), testing::host_values(here.h));
            }
          }
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
  expect_error([&] { rms_norm_linear(x, Tensor(), rand({15}), kEps, w, Tensor()); }, "norm weight shape");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, rand({6, 8}), Tensor()); }, "weight shape");
  expect_error(
      [&] {
        rms_norm_linear(x, Tensor(), gamma, kEps, rand({5, 16}), Tensor(), GatedActivation::geglu);
      },
      "geglu the weight is [w_gate; w_up] and needs an even row count");
  expect_error([&] { rms_norm_linear(x, rand({3, 16}), gamma, kEps, w, Tensor()); }, "residual");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, w.to(DType::bf16), Tensor()); }, "weight");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, w, rand({5})); }, "bias shape");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, 0.0, w, Tensor()); }, "eps");
  expect_error([&] { rms_norm_linear(x, Tensor(), gamma, kEps, w, Tensor(), GatedActivation::none, rand({8})); },
               "input norm weight shape");
}

// QK-norm as one op (ops/qk_norm.h): q and k as the qkv projection's column views, each head against rms_norm on
// the CPU; head dims of the families (64, 128, 256) and one past CUDA's one-kernel limit in f32 (the composition).
TEST_P(NormLinearTest, QkRmsNormEqualsTheTwoRmsNorms) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t d : {64, 128, 256}) {
      for (int64_t tokens : {1, 2, 7}) {
        SCOPED_TRACE(str_cat(dtype_name(dtype), " d ", d, " tokens ", tokens));
        const int64_t hq = 4, hk = 2;
        const Tensor qkv = random_tensor({1, tokens, (hq + 2 * hk) * d}, dtype, Device::cpu(), -2, 2);
        const Tensor q_weight = random_tensor({d}, dtype, Device::cpu(), 0.5, 1.5);
        const Tensor k_weight = random_tensor({d}, dtype, Device::cpu(), 0.5, 1.5);
        auto views = [&](const Tensor& t) {
          return std::pair{t.narrow(2, 0, hq * d).view({1, tokens, hq, d}),
                           t.narrow(2, hq * d, hk * d).view({1, tokens, hk, d})};
        };
        const auto [q, k] = views(qkv);
        const auto [q_dev, k_dev] = views(qkv.to(device()));
        const auto [q_out, k_out] = qk_rms_norm(q_dev, k_dev, q_weight.to(device()), k_weight.to(device()), kEps);
        ASSERT_EQ(q_out.shape(), q.shape());
        ASSERT_EQ(k_out.shape(), k.shape());
        EXPECT_LE(testing::relative_error(q_out.to(Device::cpu()), rms_norm(q, q_weight, kEps)),
                  testing::tolerance(dtype));
        EXPECT_LE(testing::relative_error(k_out.to(Device::cpu()), rms_norm(k, k_weight, kEps)),
                  testing::tolerance(dtype));
      }
    }
  }
  const Tensor q = random_tensor({2, 4, 8}, DType::f32, device()), k = random_tensor({2, 1, 8}, DType::f32, device());
  const Tensor w = random_tensor({8}, DType::f32, device());
  const std::string message = testing::message_of<Error>([&] { qk_rms_norm(q, k, w, w.narrow(0, 0, 4), kEps); });
  EXPECT_NE(message.find("qk_rms_norm"), std::string::npos) << message;
  EXPECT_NE(message.find("k weight shape"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Devices, NormLinearTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
