// microLLM CUDA ops at the shapes of Qwen2.5-0.5B and DeepSeek-R1-Distill-Qwen-1.5B, one JSON line per
// measurement (median of repeated CUDA-event timings after warm-up). benchmarks/cuda_vs_torch.py runs
// this program and the same ops in PyTorch in one call and prints the comparison table.
//   build/cuda-release/benchmarks/cuda_ops_bench [--reps N] [--filter SUBSTRING]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "microllm/microllm.h"

namespace microllm {
namespace {

struct Model {
  const char* name;
  int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab;
};
constexpr Model kModels[] = {{"qwen2.5-0.5b", 896, 4864, 14, 2, 64, 151936},
                             {"deepseek-r1-distill-qwen-1.5b", 1536, 8960, 12, 2, 128, 151936}};

int g_reps = 30;
std::string g_filter;
const Device kGpu = Device::cuda(0);

Tensor random(const Shape& shape, DType dtype = DType::bf16, double lo = -1, double hi = 1) {
  static Generator gen(2026);
  return Tensor::uniform(shape, gen, lo, hi, dtype, kGpu);
}

// Times fn with CUDA events: warm-up, then the median of g_reps single runs.
double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  const cuda::Stream stream = cuda::current_stream(0);
  std::vector<float> times;
  for (int i = 0; i < g_reps; ++i) {
    cuda::Event start(0), end(0);
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    times.push_back(cuda::Event::elapsed_ms(start, end));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Whether --filter selects the row of `op` and `model`.
bool selected(const std::string& op, const std::string& model) {
  return g_filter.empty() || (op + " " + model).find(g_filter) != std::string::npos;
}

void report(const std::string& op, const std::string& model, int64_t tokens, const std::string& shape, double bytes,
            double flops, const std::function<void()>& fn) {
  if (!selected(op, model)) return;
  const double ms = median_ms(fn);
  std::printf(
      "{\"op\": \"%s\", \"model\": \"%s\", \"tokens\": %lld, \"shape\": \"%s\", \"ms\": %.6f, \"bytes\": %.0f, "
      "\"flops\": %.0f}\n",
      op.c_str(), model.c_str(), static_cast<long long>(tokens), shape.c_str(), ms, bytes, flops);
  std::fflush(stdout);
}

// Causal attention forward and backward in the model's [B, T, H, D] layout; attention_fwd_mma is the forward on
// the portable mma.sync kernel (set_flash_wgmma(false)), where attention_fwd takes the Hopper one.
void attention_rows(const Model& m, int64_t batch, int64_t t) {
  if (!selected("attention_fwd", m.name) && !selected("attention_bwd", m.name)) return;  // no inputs to build
  const double e = 2;  // bf16 bytes
  const Tensor aq = random({batch, t, m.heads, m.head_dim}), ak = random({batch, t, m.kv_heads, m.head_dim});
  const Tensor av = random({batch, t, m.kv_heads, m.head_dim}), ado = random({batch, t, m.heads, m.head_dim});
  const double attn_flops = 4.0 * batch * m.heads * m.head_dim * (t * (t + 1) / 2.0);  // causal: half the scores
  const std::string shape = str_cat("B", batch, " T", t, " H", m.heads, "/", m.kv_heads, " D", m.head_dim);
  const double rows = static_cast<double>(batch * t);
  report("attention_fwd", m.name, t, shape, e * rows * (2 * m.heads + 2 * m.kv_heads) * m.head_dim, attn_flops,
         [&] { attention(aq.transpose(1, 2), ak.transpose(1, 2), av.transpose(1, 2)); });
  const bool wgmma = flash_wgmma();
  set_flash_wgmma(false);
  report("attention_fwd_mma", m.name, t, shape, e * rows * (2 * m.heads + 2 * m.kv_heads) * m.head_dim, attn_flops,
         [&] { attention(aq.transpose(1, 2), ak.transpose(1, 2), av.transpose(1, 2)); });
  set_flash_wgmma(wgmma);
  const AttentionResult fwd = attention(aq.transpose(1, 2), ak.transpose(1, 2), av.transpose(1, 2));
  report("attention_bwd", m.name, t, shape, e * rows * (4 * m.heads + 4 * m.kv_heads) * m.head_dim, 2.5 * attn_flops,
         [&] { attention_backward(aq.transpose(1, 2), ak.transpose(1, 2), av.transpose(1, 2), fwd, ado.transpose(1, 2)); });
}

void model_ops(const Model& m) {
  const double e = 2;  // bf16 bytes
  for (int64_t t : {int64_t{1}, int64_t{512}, int64_t{2048}}) {
    const Tensor x = random({t, m.hidden}), res = random({t, m.hidden}), w = random({m.hidden}, DType::bf16, 0.5, 1.5);
    report("rms_norm_residual", m.name, t, str_cat("[", t, ", ", m.hidden, "]"), e * 4 * t * m.hidden, 0,
           [&] { rms_norm_residual(x, res, w, 1e-6); });
    const Tensor q = random({1, t, m.heads, m.head_dim});
    const Tensor pos = Tensor::arange(t, DType::i64, kGpu);
    const RopeParams rp{1e6, RopeLayout::split_half, {}};
    report("rope", m.name, t, str_cat("[1, ", t, ", ", m.heads, ", ", m.head_dim, "]"),
           e * 2 * t * m.heads * m.head_dim, 0, [&] { rope(q, pos, rp); });
    const Tensor gate = random({t, m.intermediate}), up = random({t, m.intermediate});
    report("swiglu", m.name, t, str_cat("[", t, ", ", m.intermediate, "]"), e * 3 * t * m.intermediate, 0,
           [&] { swiglu(gate, up); });
    // The projections of one decoder layer and the LM head: y = x W^T.
    const int64_t qkv = (m.heads + 2 * m.kv_heads) * m.head_dim;
    const std::pair<const char*, std::pair<int64_t, int64_t>> gemms[] = {
        {"gemm_qkv", {qkv, m.hidden}}, {"gemm_o", {m.hidden, m.heads * m.head_dim}},
        {"gemm_gate_up", {2 * m.intermediate, m.hidden}}, {"gemm_down", {m.hidden, m.intermediate}},
        {"gemm_lm_head", {m.vocab, m.hidden}}};
    for (const auto& [name, dims] : gemms) {
      const auto [n, k] = dims;
      const Tensor a = random({t, k}), weight = random({n, k}, DType::bf16, -0.05, 0.05);
      report(name, m.name, t, str_cat("[", t, ", ", k, "] x [", n, ", ", k, "]^T"), e * (t * k + n * k + t * n),
             2.0 * t * n * k, [&] { linear(a, weight); });
    }
    if (t >= 512) {
      const Tensor logits = random({t, m.vocab}, DType::bf16, -4, 4);
      const Tensor targets = Tensor::arange(0, static_cast<double>(t * 37), 37, DType::i64, kGpu);
      const Tensor one = Tensor::ones({}, DType::f32, kGpu);
      report("cross_entropy_fwd_bwd", m.name, t, str_cat("[", t, ", ", m.vocab, "]"), e * 3 * t * m.vocab, 0, [&] {
        cross_entropy(logits, targets);
        cross_entropy_backward(logits, targets, one);
      });
      attention_rows(m, 1, t);  // a prefill
    }
  }
  attention_rows(m, 8, 1024);  // a training batch
  // Decode attention: batch 8, one new token against a 2048-token cache.
  const int64_t batch = 8, context = 2048;
  const Tensor q = random({batch, m.heads, 1, m.head_dim});
  const Tensor k = random({batch, m.kv_heads, context, m.head_dim}), v = random({batch, m.kv_heads, context, m.head_dim});
  AttentionParams p;
  p.q_offset = context - 1;
  report("attention_decode", m.name, 1, str_cat("B", batch, " ctx", context, " H", m.heads, "/", m.kv_heads, " D", m.head_dim),
         2.0 * batch * 2 * m.kv_heads * context * m.head_dim, 4.0 * batch * m.heads * context * m.head_dim,
         [&] { attention(q, k, v, p); });
  // The same decode through a paged cache (16-token blocks in a shuffled order), batch 1, 8 and 32; the grid
  // is sized for a 4096-token max_context as a captured graph would be, so splits past 2048 exit at once.
  for (int64_t b : {int64_t{1}, int64_t{8}, int64_t{32}}) {
    const int64_t block = 16, per_seq = context / block, blocks = b * per_seq, max_context = 4096;
    const int64_t width = max_context / block;  // table columns past a sequence's blocks hold -1 (never read)
    std::vector<int32_t> ids(static_cast<size_t>(b * width), -1);
    for (int64_t i = 0; i < blocks; ++i) {
      ids[static_cast<size_t>(i / per_seq * width + i % per_seq)] = static_cast<int32_t>((i * 7919) % blocks);
    }
    const Tensor tables = Tensor::from_vector(ids, {b, width}).to(kGpu);
    const Tensor pk = random({blocks, block, m.kv_heads, m.head_dim}), pv = random({blocks, block, m.kv_heads, m.head_dim});
    const Tensor pq = random({b, m.heads, m.head_dim});
    const Tensor seq = Tensor::arange(b, DType::i32, kGpu);
    const Tensor pos = Tensor::full({b}, static_cast<double>(context - 1), DType::i32, kGpu);
    const Tensor out = Tensor::empty({b, m.heads, m.head_dim}, DType::bf16, kGpu);
    report("paged_attention_decode", m.name, 1,
           str_cat("B", b, " ctx", context, " max_ctx", max_context, " blk", block, " H", m.heads, "/", m.kv_heads, " D", m.head_dim),
           2.0 * b * 2 * m.kv_heads * context * m.head_dim, 4.0 * b * m.heads * context * m.head_dim,
           [&] { paged_attention(pq, pk, pv, tables, seq, pos, 0, max_context, out); });
  }
}

// Milliseconds per call of fn as a decode step runs it: `calls` calls captured in one CUDA graph on `stream`
// and replayed, so the figure is the GPU's time per call without the host's launch cost (what the engine's
// graphs pay). fn(i) makes call i.
double graph_ms(const cuda::Stream& stream, uint64_t pool, const std::function<void(int)>& fn, int calls = 50) {
  constexpr int kReplays = 20;
  cuda::Graph graph = cuda::Graph::capture(stream, pool, [&] {
    for (int i = 0; i < calls; ++i) fn(i);
  });
  graph.replay();  // warm-up (plans, clocks)
  stream.synchronize();
  cuda::Event start(0), end(0);
  start.record(stream);
  for (int i = 0; i < kReplays; ++i) graph.replay();
  end.record(stream);
  end.synchronize();
  return cuda::Event::elapsed_ms(start, end) / (calls * kReplays);
}

// Each op of a batch-1 decode step, timed inside a CUDA graph (graph_ms). op "decode_step/<op>".
void decode_step_ops(const Model& m) {
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  const int64_t kv = m.kv_heads * m.head_dim, q = m.heads * m.head_dim, context = 256, block = 16;
  Tensor x, residual, norm_w, w_qkv, b_qkv, w_o, w_gate_up, w_down, embed, k_pool, v_pool, tables, seq, pos, slots;
  Tensor gate_up, qk, rope_pos, logits;
  SamplerRows rows;
  {
    cuda::StreamGuard on(stream);
    x = random({1, m.hidden}), residual = random({1, m.hidden}), norm_w = random({m.hidden});
    w_qkv = random({q + 2 * kv, m.hidden}, DType::bf16, -0.05, 0.05), b_qkv = random({q + 2 * kv});
    w_o = random({m.hidden, q}, DType::bf16, -0.05, 0.05);
    w_gate_up = random({2 * m.intermediate, m.hidden}, DType::bf16, -0.05, 0.05);
    w_down = random({m.hidden, m.intermediate}, DType::bf16, -0.05, 0.05);
    embed = random({m.vocab, m.hidden}, DType::bf16, -0.05, 0.05);
    k_pool = random({context / block, block, m.kv_heads, m.head_dim});
    v_pool = random({context / block, block, m.kv_heads, m.head_dim});
    tables = Tensor::arange(context / block, DType::i32, kGpu).reshape({1, context / block});
    seq = Tensor::zeros({1}, DType::i32, kGpu);
    pos = Tensor::full({1}, static_cast<double>(context - 1), DType::i32, kGpu);
    slots = Tensor::full({1}, static_cast<double>(context - 1), DType::i32, kGpu);
    rope_pos = Tensor::full({1, 1}, static_cast<double>(context - 1), DType::i32, kGpu);
    gate_up = random({1, 2 * m.intermediate});
    qk = random({1, 1, m.heads + m.kv_heads, m.head_dim});
    logits = random({1, m.vocab});
    rows = make_sampler_rows(std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0}, {1}, m.vocab, {}, kGpu);
  }
  stream.synchronize();
  RopeParams rope_params;
  rope_params.theta = 1e6;
  auto graph_timed = [&](const std::string& op, const std::string& shape, double bytes,
                         const std::function<void()>& fn) {
    if (!selected("decode_step/" + op, m.name)) return;
    const double ms = graph_ms(stream, pool, [&](int) { fn(); });
    std::printf("{\"op\": \"decode_step/%s\", \"model\": \"%s\", \"tokens\": 1, \"shape\": \"%s\", \"ms\": %.6f, "
                "\"bytes\": %.0f, \"flops\": 0}\n",
                op.c_str(), m.name, shape.c_str(), ms, bytes);
    std::fflush(stdout);
  };
  const double e = 2;
  graph_timed("rms_norm_residual", str_cat("[1, ", m.hidden, "]"), e * 4 * m.hidden, [&] { rms_norm_residual(x, residual, norm_w, 1e-6); });
  graph_timed("linear_qkv", str_cat("[1, ", m.hidden, "] x [", q + 2 * kv, ", ", m.hidden, "]"), e * w_qkv.numel(),
              [&] { linear(x, w_qkv, b_qkv); });
  graph_timed("rope_qk", str_cat("[1, 1, ", m.heads + m.kv_heads, ", ", m.head_dim, "]"), e * 2 * qk.numel(),
              [&] { rope(qk, rope_pos, rope_params); });
  graph_timed("paged_kv_write", str_cat("[1, ", m.kv_heads, ", ", m.head_dim, "]"), e * 4 * kv, [&] {
    paged_kv_write(k_pool, v_pool, qk.reshape({1, m.heads + m.kv_heads, m.head_dim}).narrow(1, 0, m.kv_heads),
                   qk.reshape({1, m.heads + m.kv_heads, m.head_dim}).narrow(1, 0, m.kv_heads), slots);
  });
  const Tensor pq = random({1, m.heads, m.head_dim});
  graph_timed("paged_attention", str_cat("ctx ", context, " max_ctx ", context), e * 2 * context * kv,
              [&] { paged_attention(pq, k_pool, v_pool, tables, seq, pos, 0, context); });
  // What a decode step runs instead of the three above: rotary + cache write + attention in one kernel.
  const Tensor qkv_row = random({1, q + 2 * kv}), attn_out = random({1, m.heads, m.head_dim});
  graph_timed("paged_decode_attention", str_cat("ctx ", context, " max_ctx ", context), e * 2 * context * kv, [&] {
    paged_decode_attention(qkv_row.narrow(1, 0, q).view({1, m.heads, m.head_dim}),
                           qkv_row.narrow(1, q, kv).view({1, m.kv_heads, m.head_dim}),
                           qkv_row.narrow(1, q + kv, kv).view({1, m.kv_heads, m.head_dim}), rope_params, k_pool,
                           v_pool, slots, tables, seq, pos, 0, context, attn_out);
  });
  // The same with the o projection and the residual add: one kernel where it fits (Qwen2.5-0.5B), else the two.
  const Tensor projected = random({1, m.hidden});
  graph_timed("paged_decode_attention_projected", str_cat("ctx ", context, " + o [", m.hidden, ", ", q, "]"),
              e * (2 * context * kv + w_o.numel()), [&] {
                paged_decode_attention_projected(qkv_row.narrow(1, 0, q).view({1, m.heads, m.head_dim}),
                                                 qkv_row.narrow(1, q, kv).view({1, m.kv_heads, m.head_dim}),
                                                 qkv_row.narrow(1, q + kv, kv).view({1, m.kv_heads, m.head_dim}),
                                                 rope_params, k_pool, v_pool, slots, tables, seq, pos, 0, context, w_o,
                                                 residual, projected);
              });
  graph_timed("linear_o", str_cat("[1, ", q, "] x [", m.hidden, ", ", q, "]"), e * w_o.numel(),
              [&] { linear(pq.reshape({1, q}), w_o); });
  graph_timed("linear_gate_up", str_cat("[1, ", m.hidden, "] x [", 2 * m.intermediate, ", ", m.hidden, "]"),
              e * w_gate_up.numel(), [&] { linear(x, w_gate_up); });
  graph_timed("swiglu", str_cat("[1, ", m.intermediate, "]"), e * 3 * m.intermediate, [&] {
    swiglu(gate_up.narrow(1, 0, m.intermediate), gate_up.narrow(1, m.intermediate, m.intermediate));
  });
  graph_timed("linear_down", str_cat("[1, ", m.intermediate, "] x [", m.hidden, ", ", m.intermediate, "]"),
              e * w_down.numel(), [&] { linear(gate_up.narrow(1, 0, m.intermediate), w_down); });
  graph_timed("lm_head", str_cat("[1, ", m.hidden, "] x [", m.vocab, ", ", m.hidden, "]"), e * embed.numel(),
              [&] { linear(x, embed); });
  graph_timed("sample_tokens_greedy", str_cat("[1, ", m.vocab, "]"), e * m.vocab, [&] { sample_tokens(logits, rows); });
  graph_timed("embedding", str_cat("[1] of [", m.vocab, ", ", m.hidden, "]"), e * 2 * m.hidden,
              [&] { embedding(embed, seq.reshape({1, 1})); });
}

// Enough copies of a [rows, cols] bf16 weight that together they exceed 200 MB (4x the 50 MB L2), made on
// `stream`: a graph that reads the next copy on each call never finds its weight in L2.
std::vector<Tensor> cold_weight_copies(int64_t rows, int64_t cols, const cuda::Stream& stream) {
  constexpr double kColdBytes = 200e6;
  const int copies = static_cast<int>(kColdBytes / (2.0 * rows * cols)) + 2;
  std::vector<Tensor> weights;
  cuda::StreamGuard on(stream);
  for (int i = 0; i < copies; ++i) weights.push_back(random({rows, cols}, DType::bf16, -0.05, 0.05));
  return weights;
}

// Per-call ms of fn(i), i < calls, in one graph (graph_ms) with the decode GEMV off and then on; the setting is
// put back after.
struct OffOnMs {
  double off, on;
};
OffOnMs gemv_off_and_on_ms(const cuda::Stream& stream, uint64_t pool, const std::function<void(int)>& fn, int calls) {
  const bool was = decode_gemv();
  OffOnMs ms{};
  set_decode_gemv(false);
  ms.off = graph_ms(stream, pool, fn, calls);
  set_decode_gemv(true);
  ms.on = graph_ms(stream, pool, fn, calls);
  set_decode_gemv(was);
  return ms;
}

// The projections of a decode step and the head (m = 1 and 8 rows) with their weights coming from DRAM,
// through cuBLASLt (decode_gemv() off) and with the GEMV on (src/backend/cuda/gemv.cu; past its size limit
// that is cuBLASLt too): each call reads the next of cold_weight_copies, so no call finds its weights in L2;
// the calls over all copies are captured in one CUDA graph, replayed, and timed per call (no host launch
// cost, as in the engine's graphs). op "decode_linear/<qkv|o|gate_up|down|head>"; "ms" is the GEMV-on time
// (the path the model takes), "cublaslt_ms" the other, "speedup" = cublaslt_ms / gemv_ms, "*_tbps" the
// weight bytes per second.
void decode_linear_ops(const Model& m) {
  const int64_t q = m.heads * m.head_dim, qkv = q + 2 * m.kv_heads * m.head_dim;
  struct Projection {
    const char* name;
    int64_t n, k;
    bool bias;
  };
  const Projection projections[] = {{"qkv", qkv, m.hidden, true},
                                    {"o", m.hidden, q, false},
                                    {"gate_up", 2 * m.intermediate, m.hidden, false},
                                    {"down", m.hidden, m.intermediate, false},
                                    {"head", m.vocab, m.hidden, false}};
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  for (const Projection& p : projections) {
    for (int64_t rows : {int64_t{1}, int64_t{8}}) {
      const std::string op = str_cat("decode_linear/", p.name);
      if (!selected(op, m.name)) continue;
      const double weight_bytes = 2.0 * p.n * p.k;
      const std::vector<Tensor> weights = cold_weight_copies(p.n, p.k, stream);
      const int copies = static_cast<int>(weights.size());
      Tensor x, bias;
      {
        cuda::StreamGuard on(stream);
        x = random({rows, p.k});
        if (p.bias) bias = random({p.n});
      }
      stream.synchronize();
      const OffOnMs ms = gemv_off_and_on_ms(
          stream, pool, [&](int i) { linear(x, weights[static_cast<size_t>(i)], bias); }, copies);
      const double lt_ms = ms.off, gemv_ms = ms.on;
      const double bytes = weight_bytes + 2.0 * rows * (p.k + p.n);
      std::printf(
          "{\"op\": \"%s\", \"model\": \"%s\", \"tokens\": %lld, \"shape\": \"[%lld, %lld] x [%lld, %lld]^T%s, %d weight "
          "copies\", \"ms\": %.6f, \"cublaslt_ms\": %.6f, \"speedup\": %.3f, \"gemv_tbps\": %.3f, \"cublaslt_tbps\": "
          "%.3f, \"bytes\": %.0f, \"flops\": %.0f}\n",
          op.c_str(), m.name, static_cast<long long>(rows), static_cast<long long>(rows), static_cast<long long>(p.k),
          static_cast<long long>(p.n), static_cast<long long>(p.k), p.bias ? " + bias" : "", copies, gemv_ms, lt_ms,
          lt_ms / gemv_ms, bytes / gemv_ms / 1e9, bytes / lt_ms / 1e9, bytes, 2.0 * rows * p.n * p.k);
      std::fflush(stdout);
    }
  }
  cuda::release_graph_pool(0, pool);
}

// The two RMSNorm + projection steps of a decode layer as rms_norm_linear (ops/norm_linear.h), weights from
// DRAM as in decode_linear: "ms" folded into the GEMV, "cublaslt_ms" the separate kernels (rms_norm with the
// residual add, cuBLASLt, and swiglu for gate_up). op "decode_norm_linear/<qkv|gate_up_swiglu>".
void decode_norm_linear_ops(const Model& m) {
  const int64_t qkv = (m.heads + 2 * m.kv_heads) * m.head_dim;
  struct Step {
    const char* name;
    int64_t weight_rows;
    bool bias, swiglu;
  };
  const Step steps[] = {{"qkv", qkv, true, false}, {"gate_up_swiglu", 2 * m.intermediate, false, true}};
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  for (const Step& p : steps) {
    for (int64_t rows : {int64_t{1}, int64_t{8}}) {
      const std::string op = str_cat("decode_norm_linear/", p.name);
      if (!selected(op, m.name)) continue;
      const double weight_bytes = 2.0 * p.weight_rows * m.hidden;
      const std::vector<Tensor> weights = cold_weight_copies(p.weight_rows, m.hidden, stream);
      const int copies = static_cast<int>(weights.size());
      Tensor x, residual, gamma, bias;
      {
        cuda::StreamGuard on(stream);
        x = random({rows, m.hidden});
        residual = random({rows, m.hidden});
        gamma = random({m.hidden}, DType::bf16, 0.5, 1.5);
        if (p.bias) bias = random({p.weight_rows});
      }
      stream.synchronize();
      const OffOnMs ms = gemv_off_and_on_ms(
          stream, pool,
          [&](int i) {
            rms_norm_linear(x, residual, gamma, 1e-6, weights[static_cast<size_t>(i)], bias,
                            p.swiglu ? GatedActivation::swiglu : GatedActivation::none);
          },
          copies);
      const double separate_ms = ms.off, folded_ms = ms.on;
      const int64_t n = p.swiglu ? p.weight_rows / 2 : p.weight_rows;
      const double bytes = weight_bytes + 2.0 * rows * (3 * m.hidden + n);
      std::printf(
          "{\"op\": \"%s\", \"model\": \"%s\", \"tokens\": %lld, \"shape\": \"[%lld, %lld] x [%lld, %lld]^T, %d weight "
          "copies\", \"ms\": %.6f, \"cublaslt_ms\": %.6f, \"speedup\": %.3f, \"gemv_tbps\": %.3f, \"bytes\": %.0f, "
          "\"flops\": %.0f}\n",
          op.c_str(), m.name, static_cast<long long>(rows), static_cast<long long>(rows),
          static_cast<long long>(m.hidden), static_cast<long long>(p.weight_rows), static_cast<long long>(m.hidden),
          copies, folded_ms, separate_ms, separate_ms / folded_ms, bytes / folded_ms / 1e9, bytes,
          2.0 * rows * p.weight_rows * m.hidden);
      std::fflush(stdout);
    }
  }
  cuda::release_graph_pool(0, pool);
}

// The MLP's input half as rms_norm_linear at prefill sizes: rms_norm, then the Hopper SwiGLU GEMM (one kernel for
// the product and SwiGLU, where swiglu_gemm_pays) against the same op with it off (cuBLASLt's product, then the
// swiglu kernel). op "norm_gate_up_swiglu" and "norm_gate_up_swiglu_unfused".
void norm_gate_up_ops(const Model& m) {
  if (!selected("norm_gate_up_swiglu", m.name)) return;
  const double e = 2;  // bf16 bytes
  const Tensor gamma = random({m.hidden}, DType::bf16, 0.5, 1.5);
  const Tensor weight = random({2 * m.intermediate, m.hidden}, DType::bf16, -0.05, 0.05);
  for (int64_t t : {int64_t{512}, int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
    const Tensor x = random({t, m.hidden}), res = random({t, m.hidden});
    const std::string shape = str_cat("[", t, ", ", m.hidden, "] x [", 2 * m.intermediate, ", ", m.hidden, "]^T");
    const double bytes = e * (t * m.hidden * 3 + 2 * m.intermediate * m.hidden + t * m.intermediate);
    const double flops = 4.0 * t * m.intermediate * m.hidden;
    const bool fused = fused_swiglu_gemm();
    for (const bool on : {true, false}) {
      set_fused_swiglu_gemm(on);
      report(on ? "norm_gate_up_swiglu" : "norm_gate_up_swiglu_unfused", m.name, t, shape, bytes, flops,
             [&] { rms_norm_linear(x, res, gamma, 1e-6, weight, Tensor(), GatedActivation::swiglu); });
    }
    set_fused_swiglu_gemm(fused);
  }
}

// Bandwidth-bound ops on >= 64 MB, against the device-to-device copy ceiling.
void bandwidth_ops() {
  const int64_t rows = 16384, cols = 4096;  // 64 M elements: 128 MB in bf16
  const Tensor a = random({rows, cols}), b = random({rows, cols});
  const double n = static_cast<double>(rows * cols), e = 2;
  Tensor dst = Tensor::empty({rows, cols}, DType::bf16, kGpu);
  report("copy", "bandwidth", rows, "[16384, 4096] bf16", 2 * e * n, 0, [&] { dst.copy_(a); });
  report("add", "bandwidth", rows, "[16384, 4096] bf16", 3 * e * n, n, [&] { add(a, b); });
  report("silu", "bandwidth", rows, "[16384, 4096] bf16", 2 * e * n, 0, [&] { silu(a); });
  report("swiglu", "bandwidth", rows, "[16384, 4096] bf16", 3 * e * n, 0, [&] { swiglu(a, b); });
  const Tensor w = random({cols}, DType::bf16, 0.5, 1.5);
  report("rms_norm", "bandwidth", rows, "[16384, 4096] bf16", 2 * e * n, 0, [&] { rms_norm(a, w, 1e-6); });
  report("softmax", "bandwidth", rows, "[16384, 4096] bf16", 2 * e * n, 0, [&] { softmax(a); });
  const Tensor f = random({rows, cols}, DType::f32);
  report("cast_f32_bf16", "bandwidth", rows, "[16384, 4096]", 6 * n, 0, [&] { f.to(DType::bf16); });
  const Tensor big_logits = random({8192, 151936}, DType::bf16, -4, 4);
  const Tensor targets = Tensor::arange(0, 8192.0 * 11, 11, DType::i64, kGpu);
  report("cross_entropy_fwd", "bandwidth", 8192, "[8192, 151936] bf16", e * 8192.0 * 151936, 0,
         [&] { cross_entropy(big_logits, targets); });
}

// sample_tokens at the Qwen vocabulary: greedy rows, and top-k + top-p + min-p at T = 0.7 over flat logits
// (every token is a candidate: the worst case) and peaky ones (a few thousand candidates, like a real model).
void sampling_ops() {
  const int64_t vocab = 151936;
  for (int64_t batch : {int64_t{1}, int64_t{32}}) {
    for (const auto& [kind, low] : {std::pair<const char*, double>{"flat", -4}, {"peaky", -300}}) {
      const Tensor logits = random({batch, vocab}, DType::bf16, low, 10);
      for (const bool greedy : {true, false}) {
        if (greedy && std::string(kind) == "peaky") continue;
        generate::SamplingParams sp;
        sp.temperature = greedy ? 0.0 : 0.7;
        sp.top_k = greedy ? 0 : 50;
        sp.top_p = greedy ? 1.0 : 0.9;
        sp.min_p = greedy ? 0.0 : 0.05;
        std::vector<float> params;
        for (int64_t b = 0; b < batch; ++b) {
          const std::vector<float> row = sp.row();
          params.insert(params.end(), row.begin(), row.end());
        }
        SamplerRows rows = make_sampler_rows(params, std::vector<int64_t>(batch, 7), vocab, {}, kGpu);
        const Tensor out = Tensor::empty({batch}, DType::i32, kGpu);
        report(greedy ? "sample_greedy" : str_cat("sample_topk_topp_", kind), "sampling", batch,
               str_cat("[", batch, ", ", vocab, "] bf16"), 2.0 * batch * vocab, 0,
               [&] { sample_tokens(logits, rows, out); });
      }
    }
  }
}

// sample_tokens of greedy rows inside a CUDA graph, as the engine's decode step runs it, at the Qwen vocabulary:
// with SamplerRows::greedy_only (the max and finish kernels) and without (the same rows through the candidate
// pass, the segmented sort and the choice, whose segments are all empty). op "decode_step/sample_tokens_<path>",
// tokens = rows.
void sampling_graph_ops() {
  const int64_t vocab = 151936;
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  for (int64_t batch : {int64_t{1}, int64_t{8}, int64_t{32}}) {
    for (const bool greedy_only : {true, false}) {
      const std::string op = greedy_only ? "decode_step/sample_tokens_greedy_only" : "decode_step/sample_tokens_general";
      if (!selected(op, "sampling")) continue;
      Tensor logits, out;
      SamplerRows rows;
      {
        cuda::StreamGuard on(stream);
        logits = random({batch, vocab}, DType::bf16, -4, 10);
        out = Tensor::empty({batch}, DType::i32, kGpu);
        std::vector<float> params;
        for (int64_t b = 0; b < batch; ++b) params.insert(params.end(), {0, 0, 1, 0, 1, 0, 0, 0});
        rows = make_sampler_rows(params, std::vector<int64_t>(batch, 7), vocab, {}, kGpu);
        rows.greedy_only = greedy_only;
      }
      stream.synchronize();
      const double ms = graph_ms(stream, pool, [&](int) { sample_tokens(logits, rows, out); });
      std::printf("{\"op\": \"%s\", \"model\": \"sampling\", \"tokens\": %lld, \"shape\": \"[%lld, %lld] bf16\", "
                  "\"ms\": %.6f, \"bytes\": %.0f, \"flops\": 0}\n",
                  op.c_str(), static_cast<long long>(batch), static_cast<long long>(batch),
                  static_cast<long long>(vocab), ms, 2.0 * batch * vocab);
      std::fflush(stdout);
    }
  }
  stream.synchronize();
  cuda::release_graph_pool(0, pool);
}

}  // namespace
}  // namespace microllm

int main(int argc, char** argv) {
  using namespace microllm;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device\n");
    return 1;
  }
  const cuda::DeviceProperties props = cuda::device_properties(0);
  std::fprintf(stderr, "cuda_ops_bench on %s (%d SMs), median of %d runs\n", props.name.c_str(), props.multiprocessors,
               g_reps);
  bandwidth_ops();
  sampling_ops();
  for (const Model& m : kModels) model_ops(m);
  for (const Model& m : kModels) norm_gate_up_ops(m);
  for (const Model& m : kModels) decode_step_ops(m);
  for (const Model& m : kModels) decode_linear_ops(m);
  for (const Model& m : kModels) decode_norm_linear_ops(m);
  sampling_graph_ops();
  return 0;
}
