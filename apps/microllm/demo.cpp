// `microllm demo`: one decoder block (embedding, RMSNorm, GQA attention with RoPE, SwiGLU MLP, tied LM
// head, cross-entropy) written with the ops layer, forward and backward by hand through each op's
// backward function, its gradient checked against a finite difference, with per-op timings.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "microllm/microllm.h"

namespace microllm::app {
namespace {

struct Dims4 {
  int64_t batch = 2, tokens = 32, vocab = 256, hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, mlp = 128;
};

struct Weights {
  Tensor embed, norm1, wq, wk, wv, wo, norm2, gate, up, down;
};

Weights init_weights(const Dims4& d, DType dtype, uint64_t seed) {
  Generator gen(seed);
  auto normal = [&](const Shape& s, double std) { return Tensor::randn(s, gen, dtype, Device::cpu(), 0, std); };
  const double s_in = 1 / std::sqrt(static_cast<double>(d.hidden));
  return {normal({d.vocab, d.hidden}, 0.5),
          Tensor::ones({d.hidden}, dtype),
          normal({d.heads * d.head_dim, d.hidden}, s_in),
          normal({d.kv_heads * d.head_dim, d.hidden}, s_in),
          normal({d.kv_heads * d.head_dim, d.hidden}, s_in),
          normal({d.hidden, d.heads * d.head_dim}, s_in),
          Tensor::ones({d.hidden}, dtype),
          normal({d.mlp, d.hidden}, s_in),
          normal({d.mlp, d.hidden}, s_in),
          normal({d.hidden, d.mlp}, 1 / std::sqrt(static_cast<double>(d.mlp)))};
}

// Accumulated wall time per op name.
class Timer {
 public:
  template <typename Fn>
  auto time(const std::string& name, Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    auto result = fn();
    totals_[name] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  const std::map<std::string, double>& totals() const { return totals_; }

 private:
  std::map<std::string, double> totals_;
};

struct BlockResult {
  Tensor loss;
  Tensor grad_wq;  // d loss / d wq, from the hand-written backward
};

BlockResult run_block(const Dims4& d, const Weights& w, const Tensor& ids, const Tensor& targets, bool backward,
                      Timer& timer) {
  const RopeParams rope_params{1e6, RopeLayout::split_half, {}};
  const Tensor positions = Tensor::arange(d.tokens, DType::i64);
  const double eps = 1e-6;
  const Shape q_shape{d.batch, d.tokens, d.heads, d.head_dim}, kv_shape{d.batch, d.tokens, d.kv_heads, d.head_dim};

  // ---- forward ----
  Tensor x = timer.time("embedding", [&] { return embedding(w.embed, ids); });                       // [B, T, C]
  RmsNormResult n1 = timer.time("rms_norm", [&] { return rms_norm_with_stats(x, w.norm1, eps); });
  Tensor q_lin = timer.time("linear", [&] { return linear(n1.out, w.wq); }).view(q_shape);          // [B, T, H, D]
  Tensor k_lin = timer.time("linear", [&] { return linear(n1.out, w.wk); }).view(kv_shape);
  Tensor v = timer.time("linear", [&] { return linear(n1.out, w.wv); }).view(kv_shape);
  Tensor q = timer.time("rope", [&] { return rope(q_lin, positions, rope_params); });
  Tensor k = timer.time("rope", [&] { return rope(k_lin, positions, rope_params); });
  AttentionResult att = timer.time("attention", [&] {
    return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));  // [B, H, T, D]
  });
  Tensor att_flat = att.out.transpose(1, 2).reshape({d.batch, d.tokens, d.heads * d.head_dim});
  Tensor a = timer.time("linear", [&] { return linear(att_flat, w.wo); });                          // [B, T, C]
  RmsNormResult n2 = timer.time("rms_norm", [&] { return rms_norm_residual(a, x, w.norm2, eps); });  // h = a + x
  Tensor gate = timer.time("linear", [&] { return linear(n2.out, w.gate); });
  Tensor up = timer.time("linear", [&] { return linear(n2.out, w.up); });
  Tensor act = timer.time("swiglu", [&] { return swiglu(gate, up); });
  Tensor mlp_out = timer.time("linear", [&] { return linear(act, w.down); });
  Tensor r = timer.time("add", [&] { return add(n2.h, mlp_out); });
  Tensor logits = timer.time("linear", [&] { return linear(r, w.embed); });                         // tied head
  Tensor flat_logits = logits.reshape({-1, d.vocab});
  Tensor loss = timer.time("cross_entropy", [&] { return cross_entropy(flat_logits, targets.reshape({-1})); });
  if (!backward) return {loss, Tensor()};

  // ---- backward, op by op in reverse ----
  const Tensor one = Tensor::ones({}, loss.dtype());
  Tensor g_logits = timer.time("cross_entropy", [&] {
    return cross_entropy_backward(flat_logits, targets.reshape({-1}), one).view(logits.shape());
  });
  LinearGrads g_head = timer.time("linear", [&] { return linear_backward(r, w.embed, false, g_logits); });
  Tensor g_r = g_head.grad_x;
  LinearGrads g_down = timer.time("linear", [&] { return linear_backward(act, w.down, false, g_r); });
  SwigluGrads g_act = timer.time("swiglu", [&] { return swiglu_backward(gate, up, g_down.grad_x); });
  LinearGrads g_gate = timer.time("linear", [&] { return linear_backward(n2.out, w.gate, false, g_act.grad_gate); });
  LinearGrads g_up = timer.time("linear", [&] { return linear_backward(n2.out, w.up, false, g_act.grad_up); });
  Tensor g_y2 = add(g_gate.grad_x, g_up.grad_x);
  RmsNormGrads g_n2 = timer.time("rms_norm", [&] { return rms_norm_backward(g_y2, n2.h, w.norm2, n2.rstd); });
  Tensor g_h = add(g_n2.grad_h, g_r);  // h feeds both the norm and the final residual add
  LinearGrads g_o = timer.time("linear", [&] { return linear_backward(att_flat, w.wo, false, g_h); });
  Tensor g_att = g_o.grad_x.view(q_shape).transpose(1, 2);  // [B, H, T, D]
  AttentionGrads g_qkv = timer.time("attention", [&] {
    return attention_backward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), att, g_att);
  });
  Tensor g_q = timer.time("rope", [&] { return rope_backward(g_qkv.grad_q.transpose(1, 2), positions, rope_params); })
                   .view({d.batch, d.tokens, d.heads * d.head_dim});
  LinearGrads g_wq = timer.time("linear", [&] { return linear_backward(n1.out, w.wq, false, g_q); });
  return {loss, g_wq.grad_weight};
}

void run_demo(bool check_gradient) {
  const Dims4 d;
  Generator gen(7);
  const Tensor ids = Tensor::uniform({d.batch, d.tokens}, gen, 0, static_cast<double>(d.vocab), DType::f32).to(DType::i64);
  const Tensor targets = Tensor::uniform({d.batch, d.tokens}, gen, 0, static_cast<double>(d.vocab), DType::f32).to(DType::i64);
  std::printf("microLLM %s demo: one decoder block on the CPU (%d threads)\n", MICROLLM_VERSION_STRING, num_threads());
  std::printf("  batch %lld, tokens %lld, vocab %lld, hidden %lld, heads %lld/%lld (GQA), head_dim %lld, mlp %lld\n",
              static_cast<long long>(d.batch), static_cast<long long>(d.tokens), static_cast<long long>(d.vocab),
              static_cast<long long>(d.hidden), static_cast<long long>(d.heads), static_cast<long long>(d.kv_heads),
              static_cast<long long>(d.head_dim), static_cast<long long>(d.mlp));

  Timer timer;
  const Weights w32 = init_weights(d, DType::f32, 1);
  for (int warmup = 0; warmup < 2; ++warmup) {
    Timer scratch;
    run_block(d, w32, ids, targets, true, scratch);
  }
  constexpr int kRuns = 10;
  BlockResult result;
  for (int i = 0; i < kRuns; ++i) result = run_block(d, w32, ids, targets, true, timer);
  std::printf("  f32 loss %.6f (uniform guess: ln %lld = %.6f)\n", result.loss.item<double>(),
              static_cast<long long>(d.vocab), std::log(static_cast<double>(d.vocab)));
  std::printf("\n  %-16s %12s\n", "op", "ms/step");
  double total = 0;
  for (const auto& [name, ms] : timer.totals()) {
    std::printf("  %-16s %12.3f\n", name.c_str(), ms / kRuns);
    total += ms / kRuns;
  }
  std::printf("  %-16s %12.3f   (forward + backward)\n", "total", total);

  if (!check_gradient) return;
  // The hand-written backward against a central difference, in f64 where rounding cannot hide a bug.
  const Weights w64 = init_weights(d, DType::f64, 1);
  Timer unused;
  const BlockResult exact = run_block(d, w64, ids, targets, true, unused);
  const double analytic = exact.grad_wq.to_vector<double>()[0];
  const double eps = 1e-6;
  Weights plus = w64, minus = w64;
  plus.wq = w64.wq.clone();
  minus.wq = w64.wq.clone();
  plus.wq.data<double>()[0] += eps;
  minus.wq.data<double>()[0] -= eps;
  const double numeric = (run_block(d, plus, ids, targets, false, unused).loss.item<double>() -
                          run_block(d, minus, ids, targets, false, unused).loss.item<double>()) / (2 * eps);
  const double error = std::abs(analytic - numeric) / std::max(1e-12, std::abs(numeric));
  std::printf("\n  gradient check, d loss / d q_proj.weight[0, 0] in f64:\n");
  std::printf("    backward %.10e   finite difference %.10e   relative error %.2e  %s\n", analytic, numeric, error,
              error < 1e-5 ? "OK" : "MISMATCH");
  if (error >= 1e-5) throw ValueError("demo", "the backward pass disagrees with the finite difference");
}

}  // namespace

void register_demo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("demo", "One decoder block from the ops: forward, backward, gradient check");
  auto check = std::make_shared<bool>(true);  // outlives this function: the callback runs after parsing
  cmd->add_flag("!--no-check", *check, "Skip the f64 finite-difference check");
  cmd->callback([check] { run_demo(*check); });
}

}  // namespace microllm::app
