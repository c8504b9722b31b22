// CPU reference ops at the shapes of real models (Qwen2.5-0.5B and DeepSeek-R1-Distill-Qwen-1.5B,
// from tests/fixtures/configs), reporting GFLOP/s and GB/s. Run:
//   build/cpu-release/benchmarks/cpu_ops_bench [--benchmark_filter=...]
// The CPU backend is the readable reference, so these numbers size test runs and the CPU quickstart;
// they are not a speed claim against PyTorch.
#include <benchmark/benchmark.h>

#include "microllm/microllm.h"

namespace microllm {
namespace {

struct ModelShape {
  const char* name;
  int64_t hidden, intermediate, heads, kv_heads, head_dim;
};
constexpr ModelShape kQwen05{"qwen2.5-0.5b", 896, 4864, 14, 2, 64};
constexpr ModelShape kDeepSeek15{"deepseek-r1-distill-qwen-1.5b", 1536, 8960, 12, 2, 128};

Tensor random(const Shape& shape, DType dtype = DType::f32) {
  static Generator gen(1234);
  return Tensor::uniform(shape, gen, -1, 1, dtype);
}

void set_rates(benchmark::State& state, double flops, double bytes) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The MLP up-projection of one layer: x [T, hidden] @ W^T, W [intermediate, hidden].
void BM_MatmulMlpUp(benchmark::State& state, ModelShape m, DType dtype) {
  const int64_t tokens = state.range(0);
  const Tensor x = random({tokens, m.hidden}, dtype), w = random({m.intermediate, m.hidden}, dtype);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(x, w, false, true));
  const double elem = static_cast<double>(dtype_size(dtype));
  set_rates(state, 2.0 * tokens * m.hidden * m.intermediate,
            elem * (tokens * m.hidden + m.intermediate * m.hidden + tokens * m.intermediate));
}

void BM_RmsNorm(benchmark::State& state, ModelShape m) {
  const int64_t tokens = state.range(0);
  const Tensor x = random({tokens, m.hidden}), w = random({m.hidden});
  for (auto _ : state) benchmark::DoNotOptimize(rms_norm(x, w, 1e-6));
  set_rates(state, 4.0 * tokens * m.hidden, 4.0 * (2 * tokens * m.hidden + m.hidden));
}

// Softmax over attention-score rows: [heads, T, T].
void BM_Softmax(benchmark::State& state, ModelShape m) {
  const int64_t tokens = state.range(0);
  const Tensor x = random({m.heads, tokens, tokens});
  for (auto _ : state) benchmark::DoNotOptimize(softmax(x));
  set_rates(state, 5.0 * m.heads * tokens * tokens, 8.0 * m.heads * tokens * tokens);
}

// Causal GQA attention of one layer, batch 1.
void BM_Attention(benchmark::State& state, ModelShape m) {
  const int64_t tokens = state.range(0);
  const Tensor q = random({1, m.heads, tokens, m.head_dim});
  const Tensor k = random({1, m.kv_heads, tokens, m.head_dim}), v = random({1, m.kv_heads, tokens, m.head_dim});
  for (auto _ : state) benchmark::DoNotOptimize(attention(q, k, v));
  // Causal: about half of the T x T scores; two matmuls of 2 * D flops each per score.
  const double scores = static_cast<double>(m.heads) * tokens * (tokens + 1) / 2;
  set_rates(state, 4.0 * scores * m.head_dim, 4.0 * (2 * m.heads + 2 * m.kv_heads) * tokens * m.head_dim);
}

BENCHMARK_CAPTURE(BM_MatmulMlpUp, qwen05_f32, kQwen05, DType::f32)->Arg(1)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MatmulMlpUp, qwen05_bf16, kQwen05, DType::bf16)->Arg(1)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MatmulMlpUp, deepseek15_f32, kDeepSeek15, DType::f32)->Arg(1)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RmsNorm, qwen05, kQwen05)->Arg(1)->Arg(512)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_RmsNorm, deepseek15, kDeepSeek15)->Arg(1)->Arg(512)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Softmax, qwen05, kQwen05)->Arg(128)->Arg(512)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Attention, qwen05, kQwen05)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, deepseek15, kDeepSeek15)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace microllm

BENCHMARK_MAIN();
