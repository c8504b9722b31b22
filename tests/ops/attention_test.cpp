// Attention: contract errors; values and gradients against a direct f64 computation (full score matrices,
// the softmax Jacobian written out) on fresh random inputs: odd sizes, GQA, [B, T, H, D] buffers viewed as
// [B, H, T, D], causal with a KV-cache offset, sliding windows, masks with a fully masked row, every dtype; f64 finite
// differences for q, k and v; and the identities GQA == MHA with repeated kv heads, cached == full.
#include "microllm/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "microllm/core/threads.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class AttentionTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

struct Sizes {
  int64_t B, Hq, Hkv, T, S, D;
};

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Direct f64 attention from host values in row-major [B, H, T|S, D] order. mask: [B, Hq, T, S] values or
// empty; grad_out: [B, Hq, T, D] or empty (no backward).
Reference reference_attention(const Sizes& z, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& mask, const AttentionParams& p,
                              const std::vector<double>& grad_out) {
  const double scale = p.scale != 0 ? p.scale : 1 / std::sqrt(double(z.D));
  auto qi = [&](int64_t b, int64_t h, int64_t i, int64_t d) { return ((b * z.Hq + h) * z.T + i) * z.D + d; };
  auto ki = [&](int64_t b, int64_t h, int64_t j, int64_t d) { return ((b * z.Hkv + h) * z.S + j) * z.D + d; };
  Reference r;
  r.out.assign(size_t(z.B * z.Hq * z.T * z.D), 0.0);
  r.lse.assign(size_t(z.B * z.Hq * z.T), -INFINITY);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(size_t(z.B * z.Hkv * z.S * z.D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  for (int64_t b = 0; b < z.B; ++b) {
    for (int64_t h = 0; h < z.Hq; ++h) {
      const int64_t kh = h / (z.Hq / z.Hkv);
      // P [T, S] in full, then the backward through softmax's Jacobian: dS = P * (dP - sum_l P dP).
      std::vector<std::vector<double>> P(size_t(z.T), std::vector<double>(size_t(z.S), 0.0));
      for (int64_t i = 0; i < z.T; ++i) {
        std::vector<double> s(size_t(z.S), -INFINITY);
        double max = -INFINITY;
        for (int64_t j = 0; j < z.S; ++j) {
          const bool visible = (!p.causal || j <= p.q_offset + i) && (p.window == 0 || j > p.q_offset + i - p.window) &&
                               (mask.empty() || mask[size_t(((b * z.Hq + h) * z.T + i) * z.S + j)] != 0);
          if (!visible) continue;
          double dot = 0;
          for (int64_t d = 0; d < z.D; ++d) dot += q[qi(b, h, i, d)] * k[ki(b, kh, j, d)];
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        if (max == -INFINITY) continue;  // sees nothing: out 0, lse -inf, P row 0
        double sum = 0;
        for (int64_t j = 0; j < z.S; ++j) sum += std::exp(s[j] - max);
        r.lse[size_t((b * z.Hq + h) * z.T + i)] = max + std::log(sum);
        for (int64_t j = 0; j < z.S; ++j) {
          P[i][j] = std::exp(s[j] - max) / sum;
          for (int64_t d = 0; d < z.D; ++d) r.out[qi(b, h, i, d)] += P[i][j] * v[ki(b, kh, j, d)];
        }
      }
      if (grad_out.empty()) continue;
      for (int64_t i = 0; i < z.T; ++i) {
        std::vector<double> dP(size_t(z.S), 0.0);
        double weighted = 0;
        for (int64_t j = 0; j < z.S; ++j) {
          for (int64_t d = 0; d < z.D; ++d) dP[j] += grad_out[qi(b, h, i, d)] * v[ki(b, kh, j, d)];
          weighted += P[i][j] * dP[j];
        }
        for (int64_t j = 0; j < z.S; ++j) {
          const double dS = P[i][j] * (dP[j] - weighted);
          for (int64_t d = 0; d < z.D; ++d) {
            r.dv[ki(b, kh, j, d)] += P[i][j] * grad_out[qi(b, h, i, d)];
            r.dq[qi(b, h, i, d)] += scale * dS * k[ki(b, kh, j, d)];
            r.dk[ki(b, kh, j, d)] += scale * dS * q[qi(b, h, i, d)];
          }
        }
      }
    }
  }
  return r;
}

// [B, H, L, D] random values; `transposed` builds them as a [B, L, H, D] buffer viewed through transpose(1, 2).
Tensor heads(int64_t B, int64_t H, int64_t L, int64_t D, DType dtype, Device device, bool transposed) {
  if (!transposed) return random_tensor({B, H, L, D}, dtype, device, -2, 2);
  return random_tensor({B, L, H, D}, dtype, device, -2, 2).transpose(1, 2);
}

// The query row that blocking_mask hides from every key (in batch 1).
int64_t blocked_row(const Sizes& z) { return z.T - 2; }

// u8 mask [B, 1, T, S]: about a third of the keys blocked at random, and blocked_row of batch 1 fully.
Tensor blocking_mask(const Sizes& z, Device device) {
  std::vector<uint8_t> m;
  for (double u : host_values(random_tensor({z.B, 1, z.T, z.S}, DType::f64))) m.push_back(u > 0.35 ? 1 : 0);
  for (int64_t j = 0; j < z.S; ++j) m[size_t((z.T + blocked_row(z)) * z.S + j)] = 0;
  return Tensor::from_vector(m, {z.B, 1, z.T, z.S}).to(device);
}

std::vector<double> expanded_mask(const Tensor& mask, const Sizes& z) {
  if (!mask.defined()) return {};
  return host_values(mask.expand({z.B, z.Hq, z.T, z.S}).contiguous());
}

struct Case {
  const char* name = "";
  AttentionParams params;
  bool masked = false;
};

const Sizes kSizes{2, 6, 2, 5, 7, 6};
const Case kCases[] = {
    {"causal kv-cache (q_offset 2)", {true, 0, 2}, false},
    {"causal kv-cache + mask", {true, 0, 2}, true},
    {"non-causal + mask, scale 0.3", {false, 0.3, 0}, true},
    {"non-causal", {false, 0, 0}, false},
    {"sliding window 3 (q_offset 2)", {true, 0, 2, 3}, false},
    {"sliding window 2 + mask", {true, 0, 2, 2}, true},
};

TEST_P(AttentionTest, ForwardAndBackwardMatchReferenceOnEveryDtypeAndLayout) {
  const Sizes z = kSizes;
  for (DType dtype : kFloatTypes) {
    for (bool transposed : {true, false}) {
      for (const Case& c : kCases) {
        const Tensor q = heads(z.B, z.Hq, z.T, z.D, dtype, device(), transposed);
        const Tensor k = heads(z.B, z.Hkv, z.S, z.D, dtype, device(), transposed);
        const Tensor v = heads(z.B, z.Hkv, z.S, z.D, dtype, device(), transposed);
        const Tensor mask = c.masked ? blocking_mask(z, device()) : Tensor();
        const Tensor grad_out = testing::non_contiguous(random_tensor({z.B, z.Hq, z.T, z.D}, dtype, device()));
        const Reference ref = reference_attention(z, host_values(q), host_values(k), host_values(v),
                                                  expanded_mask(mask, z), c.params, host_values(grad_out));
        const AttentionResult fwd = attention(q, k, v, c.params, mask);
        ASSERT_EQ(fwd.out.shape(), q.shape());
        ASSERT_EQ(fwd.out.dtype(), dtype);
        ASSERT_EQ(fwd.lse.shape(), (Shape{z.B, z.Hq, z.T}));
        ASSERT_EQ(fwd.lse.dtype(), DType::f32);
        // Measured over 100 seeds: out, dq, dk, dv reach 2.4e-3 in bf16, 3e-4 in f16, 4e-7 in f32, 1e-15 in
        // f64 (the final rounding to dtype dominates), so the standard bounds hold with margin.
        MICROLLM_EXPECT_CLOSE(fwd.out, ref.out, tolerance(dtype)) << c.name << " " << dtype;
        MICROLLM_EXPECT_CLOSE(fwd.lse, ref.lse, tolerance(DType::f32)) << c.name << " " << dtype;

        const AttentionGrads g = attention_backward(q, k, v, fwd, grad_out, c.params, mask);
        ASSERT_EQ(g.grad_q.shape(), q.shape());
        ASSERT_EQ(g.grad_k.shape(), k.shape());
        ASSERT_EQ(g.grad_v.shape(), v.shape());
        MICROLLM_EXPECT_CLOSE(g.grad_q, ref.dq, tolerance(dtype)) << c.name << " " << dtype;
        MICROLLM_EXPECT_CLOSE(g.grad_k, ref.dk, tolerance(dtype)) << c.name << " " << dtype;
        MICROLLM_EXPECT_CLOSE(g.grad_v, ref.dv, tolerance(dtype)) << c.name << " " << dtype;
      }
    }
  }
}

TEST_P(AttentionTest, GradientsMatchFiniteDifferencesWithGqa) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Sizes z{2, 4, 2, 3, 5, 4};
  const Tensor mask = blocking_mask(z, Device::cpu());
  for (const Case& c : kCases) {
    const Tensor q = heads(z.B, z.Hq, z.T, z.D, DType::f64, Device::cpu(), false);
    const Tensor k = heads(z.B, z.Hkv, z.S, z.D, DType::f64, Device::cpu(), false);
    const Tensor v = heads(z.B, z.Hkv, z.S, z.D, DType::f64, Device::cpu(), false);
    const Tensor m = c.masked ? mask : Tensor();
    testing::expect_gradients_match(
        {q, k, v}, [&](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], c.params, m).out; },
        [&](const std::vector<Tensor>& in, const Tensor& g) {
          const AttentionResult fwd = attention(in[0], in[1], in[2], c.params, m);
          const AttentionGrads grads = attention_backward(in[0], in[1], in[2], fwd, g, c.params, m);
          return std::vector<Tensor>{grads.grad_q, grads.grad_k, grads.grad_v};
        });
  }
}

TEST_P(AttentionTest, FullyMaskedRowOutputsZeroAndPassesNoGradient) {
  const Sizes z = kSizes;
  const Tensor q = heads(z.B, z.Hq, z.T, z.D, DType::f32, device(), true);
  const Tensor k = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  const Tensor v = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  const Tensor mask = blocking_mask(z, device());
  const int64_t i = blocked_row(z);  // in batch 1 this query sees nothing
  const AttentionParams params{false, 0, 0};
  const AttentionResult fwd = attention(q, k, v, params, mask);
  const Tensor grad_out = random_tensor(q.shape(), DType::f32, device());
  const AttentionGrads g = attention_backward(q, k, v, fwd, grad_out, params, mask);
  for (int64_t h = 0; h < z.Hq; ++h) {
    EXPECT_EQ(fwd.lse.select(0, 1).select(0, h).select(0, i).item<float>(), -INFINITY);
    for (double x : host_values(fwd.out.select(0, 1).select(0, h).select(0, i))) EXPECT_EQ(x, 0.0);
    for (double x : host_values(g.grad_q.select(0, 1).select(0, h).select(0, i))) EXPECT_EQ(x, 0.0);
  }
  for (const Tensor& t : {fwd.out, g.grad_q, g.grad_k, g.grad_v})
    for (double x : host_values(t)) ASSERT_TRUE(std::isfinite(x));
}

// Repeating each kv head Hq/Hkv times turns GQA into ordinary multi-head attention; the GQA kv gradients
// are the MHA ones summed over each group.
TEST_P(AttentionTest, GqaEqualsMultiHeadWithRepeatedKvHeads) {
  const Sizes z = kSizes;
  const int64_t G = z.Hq / z.Hkv;
  const Tensor q = heads(z.B, z.Hq, z.T, z.D, DType::f32, device(), true);
  const Tensor k = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  const Tensor v = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  auto repeat = [&](const Tensor& t) {
    return t.unsqueeze(2).expand({z.B, z.Hkv, G, z.S, z.D}).reshape({z.B, z.Hq, z.S, z.D});
  };
  const AttentionParams params{true, 0, 2};
  const Tensor grad_out = random_tensor(q.shape(), DType::f32, device());
  const AttentionResult gqa = attention(q, k, v, params);
  const AttentionResult mha = attention(q, repeat(k), repeat(v), params);
  MICROLLM_EXPECT_CLOSE(gqa.out, mha.out, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(gqa.lse, mha.lse, tolerance(DType::f32));
  const AttentionGrads g_gqa = attention_backward(q, k, v, gqa, grad_out, params);
  const AttentionGrads g_mha = attention_backward(q, repeat(k), repeat(v), mha, grad_out, params);
  auto group_sum = [&](const Tensor& t) {  // [B, Hq, S, D] -> [B, Hkv, S, D]
    std::vector<double> x = host_values(t), sum(size_t(z.B * z.Hkv * z.S * z.D), 0.0);
    for (size_t n = 0; n < x.size(); ++n) {
      const int64_t rest = int64_t(n) % (z.S * z.D), h = int64_t(n) / (z.S * z.D) % z.Hq,
                    b = int64_t(n) / (z.S * z.D * z.Hq);
      sum[size_t((b * z.Hkv + h / G) * z.S * z.D + rest)] += x[n];
    }
    return sum;
  };
  MICROLLM_EXPECT_CLOSE(g_gqa.grad_q, g_mha.grad_q, tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(g_gqa.grad_k, group_sum(g_mha.grad_k), tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(g_gqa.grad_v, group_sum(g_mha.grad_v), tolerance(DType::f32));
}

// Decoding with a KV cache: the last T queries at q_offset = S - T give the last T rows of full causal
// attention over all S positions.
TEST_P(AttentionTest, CachedQueriesMatchTheTailOfFullCausalAttention) {
  const int64_t B = 1, H = 3, S = 9, T = 2, D = 5;
  const Tensor q_full = heads(B, H, S, D, DType::f32, device(), true);
  const Tensor k = heads(B, H, S, D, DType::f32, device(), true);
  const Tensor v = heads(B, H, S, D, DType::f32, device(), true);
  const AttentionResult full = attention(q_full, k, v, {true, 0, 0});
  const AttentionResult tail = attention(q_full.narrow(2, S - T, T), k, v, {true, 0, S - T});
  MICROLLM_EXPECT_CLOSE(tail.out, full.out.narrow(2, S - T, T), tolerance(DType::f32));
  MICROLLM_EXPECT_CLOSE(tail.lse, full.lse.narrow(2, S - T, T), tolerance(DType::f32));
}

// Sizes large enough that the rows split across threads: results must equal the one-thread run bit for
// bit (each row and each dK/dV row is computed by one thread in a fixed order; a race would show here).
TEST_P(AttentionTest, ThreadedRunEqualsSingleThreadedRun) {
  if (!device().is_cpu()) GTEST_SKIP() << "CPU threads";
  const Sizes z{1, 4, 2, 48, 64, 32};
  const Tensor q = heads(z.B, z.Hq, z.T, z.D, DType::f32, device(), true);
  const Tensor k = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  const Tensor v = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), true);
  const Tensor grad_out = random_tensor(q.shape(), DType::f32, device());
  const AttentionParams params{true, 0, z.S - z.T};
  auto run = [&](int threads) {
    set_num_threads(threads);
    const AttentionResult fwd = attention(q, k, v, params);
    const AttentionGrads g = attention_backward(q, k, v, fwd, grad_out, params);
    return std::vector<std::vector<double>>{host_values(fwd.out), host_values(fwd.lse), host_values(g.grad_q),
                                            host_values(g.grad_k), host_values(g.grad_v)};
  };
  const int saved = num_threads();
  const auto one = run(1);
  const auto many = run(4);
  set_num_threads(saved);
  for (size_t n = 0; n < one.size(); ++n) EXPECT_EQ(one[n], many[n]) << "output " << n;
}

// attention_weights under a sliding window: zero outside each row's window, and P V is attention's output.
TEST_P(AttentionTest, SlidingWindowWeightsAreZeroOutsideTheWindowAndGiveTheOutput) {
  const Sizes z{1, 4, 2, 6, 9, 8};
  const AttentionParams params{true, 0, 3, 4};  // queries at positions 3..8, 4 keys each
  const Tensor q = heads(z.B, z.Hq, z.T, z.D, DType::f32, device(), false);
  const Tensor k = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), false);
  const Tensor v = heads(z.B, z.Hkv, z.S, z.D, DType::f32, device(), false);
  const std::vector<double> w = host_values(attention_weights(q, k, params));
  const std::vector<double> out = host_values(attention(q, k, v, params).out);
  const std::vector<double> vs = host_values(v);
  for (int64_t h = 0; h < z.Hq; ++h) {
    for (int64_t i = 0; i < z.T; ++i) {
      const int64_t pos = params.q_offset + i;
      double sum = 0;
      for (int64_t j = 0; j < z.S; ++j) {
        const double p = w[size_t((h * z.T + i) * z.S + j)];
        if (j > pos || j <= pos - params.window) {
          EXPECT_EQ(p, 0) << "head " << h << " row " << i << " key " << j;
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1, 1e-5);
      for (int64_t d = 0; d < z.D; ++d) {
        double pv = 0;
        for (int64_t j = 0; j < z.S; ++j) {
          pv += w[size_t((h * z.T + i) * z.S + j)] * vs[size_t(((h / 2) * z.S + j) * z.D + d)];
        }
        EXPECT_NEAR(out[size_t((h * z.T + i) * z.D + d)], pv, 1e-5) << "head " << h << " row " << i << " dim " << d;
      }
    }
  }
}

TEST_P(AttentionTest, ContractErrorsNameTheOp) {
  auto t = [&](Shape shape, DType dtype = DType::f32) { return random_tensor(shape, dtype, device()); };
  const Tensor q = t({2, 4, 3, 8}), k = t({2, 2, 5, 8}), v = t({2, 2, 5, 8});
  const AttentionParams p;  // causal, q_offset 0
  const auto message = testing::error_message;
  EXPECT_THROW(attention(t({2, 4, 3}), k, v, p), ShapeError);                   // rank
  EXPECT_THROW(attention(q, t({3, 2, 5, 8}), t({3, 2, 5, 8}), p), ShapeError);  // batch
  EXPECT_THROW(attention(q, t({2, 2, 5, 6}), t({2, 2, 5, 6}), p), ShapeError);  // head dim
  EXPECT_THROW(attention(q, t({2, 3, 5, 8}), t({2, 3, 5, 8}), p), ShapeError);  // 4 % 3 != 0
  EXPECT_THROW(attention(q, k, t({2, 2, 6, 8}), p), ShapeError);                // S of k != S of v
  EXPECT_THROW(attention(q, k, t({2, 2, 5, 8}, DType::f16), p), DTypeError);
  EXPECT_THROW(attention(t({2, 4, 3, 8}, DType::i32), k, v, p), DTypeError);
  EXPECT_THROW(attention(q, k, v, p, Tensor::ones({3, 5}, DType::f32, device())), DTypeError);
  EXPECT_THROW(attention(q, k, v, p, Tensor::ones({4, 5}, DType::u8, device())), ShapeError);
  EXPECT_THROW(attention(q, k, v, {true, 0, -1}), ValueError);
  EXPECT_THROW(attention(q, k, v, {true, 0, 3}), ValueError);  // q_offset + T = 6 > S = 5
  EXPECT_NO_THROW(attention(q, k, v, {false, 0, 3}));          // without causal the offset is unused
  EXPECT_THROW(attention(q, k, v, {true, 0, 0, -1}), ValueError);   // a negative window
  EXPECT_THROW(attention(q, k, v, {false, 0, 0, 2}), ValueError);   // a window without causal
  EXPECT_NO_THROW(attention(q, k, v, {true, 0, 2}, Tensor::ones({2, 1, 3, 1}, DType::u8, device())));
  const AttentionResult fwd = attention(q, k, v, p);
  EXPECT_THROW(attention_backward(q, k, v, fwd, t({2, 4, 3, 7}), p), ShapeError);
  EXPECT_THROW(attention_backward(q, k, v, fwd, t({2, 4, 3, 8}, DType::f64), p), DTypeError);
  EXPECT_THROW(attention_backward(q, k, v, {fwd.out, fwd.lse.to(DType::f64)}, t({2, 4, 3, 8}), p), DTypeError);
  EXPECT_THROW(attention_backward(q, k, v, {fwd.out, t({2, 4})}, t({2, 4, 3, 8}), p), ShapeError);

  const std::string heads_error = message([&] { attention(q, t({2, 3, 5, 8}), t({2, 3, 5, 8}), p); });
  EXPECT_NE(heads_error.find("[attention]"), std::string::npos) << heads_error;
  EXPECT_NE(heads_error.find("multiple"), std::string::npos) << heads_error;
  const std::string causal_error = message([&] { attention(q, k, v, {true, 0, 3}); });
  EXPECT_NE(causal_error.find("q_offset + T <= S"), std::string::npos) << causal_error;
  const std::string backward_error = message([&] { attention_backward(q, k, v, fwd, t({1}), p); });
  EXPECT_NE(backward_error.find("[attention_backward]"), std::string::npos) << backward_error;
}

INSTANTIATE_TEST_SUITE_P(Devices, AttentionTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
