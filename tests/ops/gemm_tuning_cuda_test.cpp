// cuBLASLt's algorithm chosen by timing (src/backend/cuda/gemm_tuning.h): a half-precision linear of at least a
// GFLOP times the heuristic's candidates at its shape's first use, on scratch operands, and keeps the fastest.
// The product it then computes matches the CPU reference and the heuristic's first choice (tuning off), eagerly
// and when the first use is inside a CUDA graph capture, bit for bit under deterministic_algorithms(); a shape is
// timed once; small or f32 products and tuning off time nothing. Skips without a GPU.
#include <gtest/gtest.h>

#ifdef MICROLLM_WITH_CUDA

#include <limits>
#include <string>

#include "backend/cuda/gemm_tuning.h"
#include "microllm/backend/backend.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm {
namespace {

using cuda_kernels::gemm_tuning_runs;
using testing::random_tensor;

const Device kGpu = Device::cuda(0);

struct TuningSetting : testing::ScopedSwitch {
  explicit TuningSetting(bool enabled) : ScopedSwitch(gemm_tuning, set_gemm_tuning, enabled) {}
};

class GemmTuningCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(kGpu); }
  DType dtype() const { return GetParam(); }
  Tensor rand(const Shape& s, double scale = 1.0) { return random_tensor(s, dtype(), Device::cpu(), -scale, scale); }
  // A row count no other test (or other dtype's run) uses: plans are cached per shape for the process's life.
  int64_t fresh_rows(int64_t base) const { return base + (dtype() == DType::bf16 ? 0 : 8); }
};

// k = n = 1024: at m >= 477 rows a product is over a GFLOP (2 m n k), the tuning threshold.
constexpr int64_t kK = 1024, kN = 1024;

TEST_P(GemmTuningCudaTest, TunedProductMatchesTheReferenceAndTheUntunedOne) {
  const TuningSetting on(true);
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const int64_t m = fresh_rows(with_bias ? 536 : 520);
    const Tensor x_cpu = rand({m, kK}), w_cpu = rand({kN, kK}, 0.05), bias_cpu = with_bias ? rand({kN}) : Tensor();
    const Tensor x = x_cpu.to(kGpu), w = w_cpu.to(kGpu), bias = with_bias ? bias_cpu.to(kGpu) : Tensor();
    const int64_t runs = gemm_tuning_runs();
    const Tensor tuned = linear(x, w, bias).to(Device::cpu());
    EXPECT_EQ(gemm_tuning_runs(), runs + 1) << "a fresh shape of over a GFLOP is timed at its first use";
    const Tensor again = linear(x, w, bias).to(Device::cpu());
    EXPECT_EQ(gemm_tuning_runs(), runs + 1) << "and only then";
    EXPECT_LE(testing::relative_error(again, tuned), 0.0) << "the plan keeps its algorithm";
    const Tensor ref = linear(x_cpu, w_cpu, bias_cpu);
    EXPECT_LE(testing::relative_error(tuned, ref), testing::tolerance(dtype())) << "tuned vs CPU";

    // The heuristic's first choice, on a plan made with tuning off (one more row: a new shape).
    const TuningSetting off(false);
    const Tensor x1_cpu = x_cpu.narrow(0, 0, m - 1);
    const Tensor untuned = linear(x.narrow(0, 0, m - 1), w, bias).to(Device::cpu());
    EXPECT_EQ(gemm_tuning_runs(), runs + 1) << "tuning off times nothing";
    EXPECT_LE(testing::relative_error(untuned, tuned.narrow(0, 0, m - 1)), testing::tolerance(dtype()))
        << "tuned vs the heuristic's first choice";
  }
}

// The first use of a shape inside a stream capture (a prefill graph's): the timing runs on its own stream, the
// capture records only the product, and the replay computes it with the inputs written since.
TEST_P(GemmTuningCudaTest, FirstUseInsideAGraphCapture) {
  const TuningSetting on(true);
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  const int64_t m = fresh_rows(552);
  const Tensor w_cpu = rand({kN, kK}, 0.05);
  Tensor x, w, y;
  {
    const cuda::StreamGuard guard(stream);
    x = rand({m, kK}).to(kGpu);
    w = w_cpu.to(kGpu);
  }
  stream.synchronize();
  const int64_t runs = gemm_tuning_runs();
  cuda::Graph graph = cuda::Graph::capture(stream, pool, [&] { y = linear(x, w); });
  EXPECT_EQ(gemm_tuning_runs(), runs + 1) << "timed during the capture";
  for (int replay = 0; replay < 2; ++replay) {
    const Tensor x_cpu = rand({m, kK});
    {
      const cuda::StreamGuard guard(stream);
      x.copy_(x_cpu.to(kGpu));
      y.copy_(Tensor::full(y.shape(), std::numeric_limits<double>::quiet_NaN(), dtype(), kGpu));
    }
    graph.replay();
    stream.synchronize();
    const Tensor replayed = y.to(Device::cpu());
    EXPECT_LE(testing::relative_error(replayed, linear(x_cpu, w_cpu)), testing::tolerance(dtype()))
        << "replay " << replay;
    Tensor eager;
    {
      const cuda::StreamGuard guard(stream);
      eager = linear(x, w).to(Device::cpu());
    }
    EXPECT_LE(testing::relative_error(eager, replayed), 0.0) << "the graph and an eager call share the plan";
  }
  graph = cuda::Graph();
  y = Tensor();
  cuda::release_graph_pool(0, pool);
}

// One shape planned three times: the heuristic's choice (tuning off), the timed choice under
// deterministic_algorithms() (the default: only candidates with the heuristic's bits), and the timed choice
// without it (any candidate: the fastest may sum in another order, so only close).
TEST_P(GemmTuningCudaTest, DeterministicModeKeepsTheHeuristicsBits) {
  const int64_t m = fresh_rows(2048);
  const Tensor x_cpu = rand({m, kK}), w_cpu = rand({kN, kK}, 0.05);
  const Tensor x = x_cpu.to(kGpu), w = w_cpu.to(kGpu);
  auto plan_and_run = [&](bool tuning, bool deterministic) {
    const TuningSetting tune(tuning);
    const testing::ScopedSwitch det(deterministic_algorithms, set_deterministic_algorithms, deterministic);
    cuda::synchronize(0);
    cuda_kernels::clear_matmul_plans(0);
    const int64_t runs = gemm_tuning_runs();
    Tensor y = linear(x, w).to(Device::cpu());
    EXPECT_EQ(gemm_tuning_runs(), runs + (tuning ? 1 : 0));
    return y;
  };
  const Tensor heuristic = plan_and_run(false, true);
  EXPECT_LE(testing::relative_error(heuristic, linear(x_cpu, w_cpu)), testing::tolerance(dtype()));
  EXPECT_LE(testing::relative_error(plan_and_run(true, true), heuristic), 0.0) << "deterministic: the same bits";
  EXPECT_LE(testing::relative_error(plan_and_run(true, false), heuristic), testing::tolerance(dtype()));
}

// Below a GFLOP, and in f32, the heuristic's first choice stands untimed.
TEST_P(GemmTuningCudaTest, SmallAndF32ProductsAreNotTimed) {
  const TuningSetting on(true);
  const int64_t runs = gemm_tuning_runs();
  const int64_t small = fresh_rows(300);  // 2 * 300 * 1024 * 1024 < 1e9
  const Tensor x_cpu = rand({small, kK}), w_cpu = rand({kN, kK}, 0.05);
  const Tensor out = linear(x_cpu.to(kGpu), w_cpu.to(kGpu)).to(Device::cpu());
  EXPECT_LE(testing::relative_error(out, linear(x_cpu, w_cpu)), testing::tolerance(dtype()));
  const Tensor x32 = random_tensor({fresh_rows(600), kK}, DType::f32, kGpu, -1, 1);
  const Tensor w32 = random_tensor({kN, kK}, DType::f32, kGpu, -0.05, 0.05);
  (void)linear(x32, w32);
  cuda::synchronize(0);
  EXPECT_EQ(gemm_tuning_runs(), runs);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmTuningCudaTest, ::testing::Values(DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm

#endif  // MICROLLM_WITH_CUDA
