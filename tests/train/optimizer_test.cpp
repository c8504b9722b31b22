// Optimizer kernels against a direct f64 computation, on every device: AdamW (decoupled decay, bias
// corrections, grad scale), SGD (momentum, nesterov, coupled decay), bf16 moments, the sum of squares and
// the clip factor; determinism; no decay on norms, biases and embeddings.
#include "microllm/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "microllm/core/memory.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/optim.h"
#include "test_support.h"

namespace microllm::train {
namespace {

using testing::random_tensor;

class OptimTest : public testing::DeviceTest {};

// Tensors of several sizes, one longer than a kernel chunk (1 << 16) so chunking is exercised.
std::vector<Shape> shapes() { return {{3, 5}, {7}, {70001}, {1}, {33, 65}}; }

std::vector<Tensor> randoms(Device device, double low, double high, uint64_t seed) {
  std::vector<Tensor> out;
  for (const Shape& s : shapes()) out.push_back(random_tensor(s, DType::f32, device, low, high, seed++));
  return out;
}

// The largest |got - ref| / (1 + |ref|): f32 steps against the f64 rule err in proportion to their operands
// (|p| and lr * update, around 1), not to the result, which can land near 0: as a relative error, the
// one-element tensor of shapes() failed about one seed in 500 (2.5e-5 to 3.4e-3 where the result was ~1e-4).
double step_error(const Tensor& got, const std::vector<double>& ref) {
  const std::vector<double> values = testing::host_values(got);
  if (values.size() != ref.size()) return INFINITY;
  double worst = 0;
  for (size_t k = 0; k < ref.size(); ++k) {
    const double e = std::abs(values[k] - ref[k]) / (1 + std::abs(ref[k]));
    if (!(e <= worst)) worst = e;  // NaN propagates as a failure
  }
  return worst;
}

std::vector<Tensor> clones(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.clone());
  return out;
}

TEST_P(OptimTest, AdamWMatchesADirectComputationOverSeveralSteps) {
  const Device device = GetParam();
  const uint64_t seed = testing::fresh_seed();
  std::vector<Tensor> params = randoms(device, -1, 1, seed);
  std::vector<Tensor> m, v;
  for (const Tensor& p : params)
    m.push_back(Tensor::zeros(p.shape(), DType::f32, device)),
        v.push_back(Tensor::zeros(p.shape(), DType::f32, device));
  std::vector<double> wd;
  for (size_t i = 0; i < params.size(); ++i) wd.push_back(i % 2 ? 0.0 : 0.1);
  std::vector<std::vector<double>> ref_p, ref_m, ref_v;
  for (const Tensor& p : params) {
    ref_p.push_back(testing::host_values(p));
    ref_m.emplace_back(p.numel(), 0.0), ref_v.emplace_back(p.numel(), 0.0);
  }
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  for (int t = 1; t <= 3; ++t) {
    const std::vector<Tensor> grads = randoms(device, -2, 2, seed + 100 * t);
    const double scale = t == 2 ? 0.5 : 1.0;
    AdamWStep step{lr, b1, b2, eps, 1 - std::pow(b1, t), 1 - std::pow(b2, t), t};
    const Tensor grad_scale = t == 2 ? Tensor::full({1}, scale, DType::f32, device) : Tensor();
    adamw_step(params, grads, m, v, wd, grad_scale, step);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<double> g = testing::host_values(grads[i]);
      for (size_t k = 0; k < g.size(); ++k) {
        const double gk = g[k] * scale;
        ref_m[i][k] = b1 * ref_m[i][k] + (1 - b1) * gk;
        ref_v[i][k] = b2 * ref_v[i][k] + (1 - b2) * gk * gk;
        const double denom = std::sqrt(ref_v[i][k] / step.bias_correction2) + eps;
        ref_p[i][k] = ref_p[i][k] * (1 - lr * wd[i]) - lr / step.bias_correction1 * ref_m[i][k] / denom;
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(step_error(params[i], ref_p[i]), 1e-5) << "param " << i << " seed " << seed;
    EXPECT_LE(step_error(m[i], ref_m[i]), 1e-5) << "exp_avg " << i << " seed " << seed;
    EXPECT_LE(step_error(v[i], ref_v[i]), 1e-5) << "exp_avg_sq " << i << " seed " << seed;
  }
}

TEST_P(OptimTest, SgdWithMomentumAndNesterovMatchesPyTorchsRule) {
  const Device device = GetParam();
  for (bool nesterov : {false, true}) {
    const uint64_t seed = testing::fresh_seed();
    std::vector<Tensor> params = randoms(device, -1, 1, seed), buf;
    for (const Tensor& p : params) buf.push_back(Tensor::zeros(p.shape(), DType::f32, device));
    const std::vector<double> wd(params.size(), 0.01);
    std::vector<std::vector<double>> ref_p, ref_b;
    for (const Tensor& p : params) ref_p.push_back(testing::host_values(p)), ref_b.emplace_back(p.numel(), 0.0);
    const double lr = 0.1, mu = 0.9;
    for (int t = 1; t <= 3; ++t) {
      const std::vector<Tensor> grads = randoms(device, -1, 1, seed + 10 * t);
      SgdStep step{lr, mu, 0.0, nesterov, t == 1, t};
      sgd_step(params, grads, buf, wd, Tensor(), step);
      for (size_t i = 0; i < params.size(); ++i) {
        const std::vector<double> g = testing::host_values(grads[i]);
        for (size_t k = 0; k < g.size(); ++k) {
          double d = g[k] + wd[i] * ref_p[i][k];
          ref_b[i][k] = t == 1 ? d : mu * ref_b[i][k] + d;
          d = nesterov ? d + mu * ref_b[i][k] : ref_b[i][k];
          ref_p[i][k] -= lr * d;
        }
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LE(step_error(params[i], ref_p[i]), 1e-5)
          << "param " << i << " nesterov " << nesterov << " seed " << seed;
    }
  }
}

TEST_P(OptimTest, SumOfSquaresGlobalNormAndClipFactor) {
  const Device device = GetParam();
  std::vector<Tensor> xs = randoms(device, -1, 1, testing::fresh_seed());
  xs.push_back(random_tensor({300}, DType::bf16, device));
  xs.push_back(testing::non_contiguous(random_tensor({4, 6}, DType::f32, device)));
  const Tensor sums = sum_squares(xs);
  ASSERT_EQ(sums.shape(), (Shape{static_cast<int64_t>(xs.size())}));
  const std::vector<double> got = testing::host_values(sums);
  double total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double expected = 0;
    for (double x : testing::host_values(xs[i])) expected += x * x;
    EXPECT_NEAR(got[i], expected, 1e-5 * expected) << i;
    total += expected;
  }
  const Tensor norm = global_norm(xs);
  EXPECT_EQ(norm.device(), device);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(total), 1e-5 * std::sqrt(total));
  EXPECT_NEAR(clip_coefficient(norm, 1.0).item<double>(), 1.0 / (std::sqrt(total) + 1e-6), 1e-6);
  EXPECT_EQ(clip_coefficient(norm, 1e9).item<double>(), 1.0);
  // The same bits on every run.
  const Tensor again = sum_squares(xs);
  EXPECT_EQ(std::memcmp(again.to(Device::cpu()).data_ptr(), sums.to(Device::cpu()).data_ptr(), sums.nbytes()), 0);
}

TEST_P(OptimTest, Bf16MomentsTrackF32MomentsAndAreDeterministic) {
  const Device device = GetParam();
  const uint64_t seed = testing::fresh_seed();
  std::vector<Tensor> p32 = randoms(device, -1, 1, seed), p16 = clones(p32), p16b = clones(p32);
  std::vector<Tensor> m32, v32, m16, v16, m16b, v16b;
  for (const Tensor& p : p32) {
    m32.push_back(Tensor::zeros(p.shape(), DType::f32, device)),
        v32.push_back(Tensor::zeros(p.shape(), DType::f32, device));
    m16.push_back(Tensor::zeros(p.shape(), DType::bf16, device)),
        v16.push_back(Tensor::zeros(p.shape(), DType::bf16, device));
    m16b.push_back(Tensor::zeros(p.shape(), DType::bf16, device)),
        v16b.push_back(Tensor::zeros(p.shape(), DType::bf16, device));
  }
  const std::vector<double> wd(p32.size(), 0.0);
  for (int t = 1; t <= 5; ++t) {
    const std::vector<Tensor> grads = randoms(device, -1, 1, seed + t);
    const AdamWStep step{1e-3, 0.9, 0.999, 1e-8, 1 - std::pow(0.9, t), 1 - std::pow(0.999, t), t};
    adamw_step(p32, grads, m32, v32, wd, Tensor(), step);
    adamw_step(p16, grads, m16, v16, wd, Tensor(), step);
    adamw_step(p16b, grads, m16b, v16b, wd, Tensor(), step);
  }
  for (size_t i = 0; i < p32.size(); ++i) {
    if (p32[i].numel() >= 64) {  // a norm over few elements can be near 0 and make any difference relative-large
      EXPECT_LE(testing::relative_error(m16[i], m32[i]), 2e-2) << i;
      EXPECT_LE(testing::relative_error(v16[i], v32[i]), 2e-2) << i;
      // Each step moves every element by about lr; bf16 moments change that by a little.
      EXPECT_LE(testing::relative_error(p16[i], p32[i]), 1e-3) << i;
    }
    EXPECT_EQ(std::memcmp(p16[i].to(Device::cpu()).data_ptr(), p16b[i].to(Device::cpu()).data_ptr(), p16[i].nbytes()),
              0);
  }
}

TEST_P(OptimTest, ArgumentChecksNameTheProblem) {
  const Device device = GetParam();
  std::vector<Tensor> p{Tensor::zeros({4}, DType::f32, device)}, g{Tensor::zeros({5}, DType::f32, device)};
  std::vector<Tensor> m{Tensor::zeros({4}, DType::f32, device)}, v{Tensor::zeros({4}, DType::f32, device)};
  EXPECT_THROW(adamw_step(p, g, m, v, {0.0}, Tensor(), {}), ShapeError);
  g = {Tensor::zeros({4}, DType::f32, device)};
  EXPECT_THROW(adamw_step(p, g, m, v, {0.0, 0.0}, Tensor(), {}), ValueError);
  EXPECT_THROW(adamw_step(p, g, m, v, {0.0}, Tensor::zeros({2}, DType::f32, device), {}), ValueError);
  std::vector<Tensor> half{Tensor::zeros({4}, DType::f16, device)};
  EXPECT_THROW(adamw_step(p, g, half, v, {0.0}, Tensor(), {}), DTypeError);
  EXPECT_THROW(sgd_step(p, g, {}, {0.0}, Tensor(), SgdStep{.momentum = 0.9}), ValueError);
  EXPECT_THROW(sum_squares({}), ValueError);
}

// More tensors than one launch takes (36) and a tensor of more chunks than one launch covers (320 chunks of
// 65536): the device kernels split the list over several launches; the results equal the CPU kernels'.
TEST_P(OptimTest, ManyTensorsAndLongTensorsSpanSeveralLaunches) {
  const Device device = GetParam();
  const uint64_t seed = testing::fresh_seed();
  std::vector<Shape> sizes;
  for (int64_t i = 0; i < 50; ++i) sizes.push_back({1 + 37 * i});
  sizes.push_back({321 * 65536 + 5});
  sizes.push_back({3});
  std::vector<Tensor> p, g, m, v, p_cpu, m_cpu, v_cpu, g_cpu;
  std::vector<double> wd;
  for (size_t i = 0; i < sizes.size(); ++i) {
    p_cpu.push_back(random_tensor(sizes[i], DType::f32, Device::cpu(), -1, 1, seed + i));
    g_cpu.push_back(random_tensor(sizes[i], DType::f32, Device::cpu(), -1, 1, seed + 1000 + i));
    m_cpu.push_back(random_tensor(sizes[i], DType::bf16, Device::cpu(), -0.1, 0.1, seed + 2000 + i));
    v_cpu.push_back(random_tensor(sizes[i], DType::bf16, Device::cpu(), 0, 0.1, seed + 3000 + i));
    auto copy = [&](const Tensor& t) { return device.is_cpu() ? t.clone() : t.to(device); };
    p.push_back(copy(p_cpu.back())), g.push_back(copy(g_cpu.back()));
    m.push_back(copy(m_cpu.back())), v.push_back(copy(v_cpu.back()));
    wd.push_back(i % 3 ? 0.1 : 0.0);
  }
  const AdamWStep step{1e-2, 0.9, 0.95, 1e-8, 1 - 0.9 * 0.9, 1 - 0.95 * 0.95, 2};
  const Tensor scale = Tensor::full({1}, 0.75, DType::f32, device);
  adamw_step(p, g, m, v, wd, scale, step);
  adamw_step(p_cpu, g_cpu, m_cpu, v_cpu, wd, Tensor::full({1}, 0.75), step);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_LE(step_error(p[i].to(Device::cpu()), testing::host_values(p_cpu[i])), 1e-6) << i;
    EXPECT_LE(testing::relative_error(m[i].to(Device::cpu()), m_cpu[i]), 1e-2) << i;  // bf16: one rounding apart
  }
  std::vector<Tensor> mixed = g;
  mixed.insert(mixed.end(), m.begin(), m.end());
  std::vector<Tensor> mixed_cpu = g_cpu;
  mixed_cpu.insert(mixed_cpu.end(), m_cpu.begin(), m_cpu.end());
  EXPECT_LE(testing::relative_error(sum_squares(mixed).to(Device::cpu()), sum_squares(mixed_cpu)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Devices, OptimTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

// A model-level check: decay reaches weights but not norms, biases or embeddings.
TEST(Optimizer, DecaysOnlyWeightsAndSkipsParametersWithoutGradients) {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny", 32);
  c.num_layers = 1;
  c.attention_bias = true;
  c.model_type = "qwen2";
  nn::TransformerLM model(c, 1);
  Optimizer opt(model.named_parameters(), {.type = "adamw", .weight_decay = 0.5});
  // Zero gradients everywhere: AdamW then changes only what decays (p *= 1 - lr wd).
  std::vector<Tensor> before;
  for (const auto& p : model.named_parameters()) {
    before.push_back(p.variable->value().clone());
    if (p.name != "model.norm.weight") p.variable->set_grad(Tensor::zeros(p.variable->shape()));
  }
  opt.step(0.1);
  EXPECT_EQ(opt.steps(), 1);
  size_t i = 0;
  for (const auto& p : model.named_parameters()) {
    const double change = testing::relative_error(p.variable->value(), before[i++]);
    const bool decays = p.name.find("proj.weight") != std::string::npos;
    if (decays) {
      EXPECT_NEAR(change, 0.05, 1e-6) << p.name;
    } else {
      EXPECT_EQ(change, 0.0) << p.name;  // norms, biases, embeddings, and model.norm (no gradient)
    }
  }
  // The state round-trips by name.
  Optimizer other(model.named_parameters(), {.type = "adamw"});
  const auto state = opt.state();
  other.load_state([&](const std::string& name) {
    for (const auto& [n, t] : state) {
      if (n == name) return t;
    }
    throw IndexError("test", name);
  });
  EXPECT_EQ(other.steps(), 1);
}

// The moments are charged to the optimizer state (core/memory.h): two f32 tensors per parameter for AdamW.
TEST(Optimizer, MomentsAreChargedAsOptimizerState) {
  nn::TransformerConfig c;
  c.vocab_size = 32, c.hidden_size = 16, c.intermediate_size = 32, c.num_layers = 1, c.num_heads = 2;
  c.num_kv_heads = 1;
  nn::TransformerLM model(c, testing::fresh_seed());
  const auto state_live = [] {
    return memory_usage(Device::cpu()).live[static_cast<size_t>(MemoryCategory::optimizer_state)];
  };
  const int64_t before = state_live();
  {
    Optimizer opt(model.named_parameters(), {.type = "adamw"});
    EXPECT_EQ(state_live() - before, 2 * model.num_parameters() * 4);
  }
  EXPECT_EQ(state_live(), before);
}

}  // namespace
}  // namespace microllm::train
