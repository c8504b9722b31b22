// The Hopper SwiGLU GEMM (src/backend/cuda/gemm_swiglu_sm90.cu): out = silu(x w_gate^T) * (x w_up^T), run through
// its own entry point so a refused case fails here instead of passing through cuBLASLt unnoticed. Against the CPU
// reference (linear, then swiglu) on fresh random inputs at shapes that are not multiples of its tiles (rows,
// columns and k past a tile's end, which the Tensor Memory Accelerator fills with zeros), into NaN-poisoned outputs
// with a guard band and a row pitch wider than the output, so a write past [m, n] or into the pitch shows; against
// the composition it replaces (cuBLASLt, then the swiglu kernel) at both models' 2,048-token prefill shapes; through
// rms_norm_linear, which takes it at prefill size, eagerly and replayed from a CUDA graph; and the shapes it must
// refuse. Skips without an sm_90 GPU or
// without sm_90a machine code in the build.
#include <gtest/gtest.h>

#ifdef MICROLLM_WITH_CUDA

#include <cmath>
#include <limits>
#include <tuple>

#include "backend/cuda/gemm_swiglu.h"
#include "microllm/backend/backend.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

const Device kGpu = Device::cuda(0);
constexpr int64_t kGuard = 256;  // NaN elements after the output's last row

// fused_swiglu_gemm() set for a scope.
struct FusedSetting : testing::ScopedSwitch {
  explicit FusedSetting(bool enabled) : ScopedSwitch(fused_swiglu_gemm, set_fused_swiglu_gemm, enabled) {}
};

// A NaN-filled buffer holding out [m, n] with rows `pitch` elements apart, then kGuard more elements.
struct PoisonedOut {
  Tensor buffer, out;
  int64_t m, n, pitch;
  PoisonedOut(int64_t m_, int64_t n_, int64_t pitch_, DType dtype)
      : buffer(Tensor::full({m_ * pitch_ + kGuard}, std::numeric_limits<double>::quiet_NaN(), dtype, kGpu)),
        out(buffer.narrow(0, 0, m_ * pitch_).view({m_, pitch_}).narrow(1, 0, n_)),
        m(m_),
        n(n_),
        pitch(pitch_) {}
  // Every element outside out (the pitch's tail of each row and the guard) is still NaN.
  int64_t written_outside() const {
    const std::vector<double> all = testing::host_values(buffer.to(Device::cpu()));
    int64_t count = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
      const bool inside = i < m * pitch && i % pitch < n;
      if (!inside && !std::isnan(all[static_cast<size_t>(i)])) ++count;
    }
    return count;
  }
};

class SwigluGemmCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    MICROLLM_SKIP_IF_UNAVAILABLE(kGpu);
    if (!cuda_kernels::swiglu_gemm_available(0)) GTEST_SKIP() << "no sm_90 GPU or no sm_90a code in this build";
  }
  DType dtype() const { return GetParam(); }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(cuda::current_stream(0).handle()); }
};

// The reference: linear, then swiglu of its two halves (the rounded product), on the CPU.
Tensor reference(const Tensor& x, const Tensor& w) {
  const Tensor y = linear(x, w);
  const int64_t n = w.size(0) / 2;
  return swiglu(y.narrow(-1, 0, n), y.narrow(-1, n, n));
}

TEST_P(SwigluGemmCudaTest, MatchesTheCpuReference) {
  // (m, k, n): whole tiles; rows, columns and k past a tile; one column block; k of one panel.
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 128, 256},
                                {300, 200, 136},
                                {517, 72, 392},
                                {256, 64, 8},
                                {1000, 904, 264},
                                {1, 64, 128},
                                {77, 136, 64}}) {
    SCOPED_TRACE(str_cat(dtype_name(dtype()), " m ", m, " k ", k, " n ", n));
    const Tensor x = random_tensor({m, k}, dtype(), Device::cpu(), -1, 1);
    const Tensor w = random_tensor({2 * n, k}, dtype(), Device::cpu(), -0.2, 0.2);
    const PoisonedOut got(m, n, n + 24, dtype());
    const Tensor xg = x.to(kGpu), wg = w.to(kGpu);
    ASSERT_TRUE(cuda_kernels::swiglu_gemm_takes(xg, wg, got.out));
    cuda_kernels::swiglu_gemm(xg, wg, got.out, stream());
    cuda::synchronize(0);
    EXPECT_LE(testing::relative_error(got.out.to(Device::cpu()), reference(x, w)), testing::tolerance(dtype()));
    EXPECT_EQ(got.written_outside(), 0);
  }
}

// Against what it replaces on the GPU, at the models' prefill shapes (2,048 tokens): cuBLASLt's product rounded to
// the dtype, then the swiglu kernel. The sums' order differs, so a gate or up may round one unit apart.
TEST_P(SwigluGemmCudaTest, MatchesTheCompositionAtModelShapes) {
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{896, 4864}, {1536, 8960}}) {
    SCOPED_TRACE(str_cat(dtype_name(dtype()), " k ", k, " n ", n));
    const int64_t m = 2048;
    const Tensor x = random_tensor({m, k}, dtype(), kGpu, -1, 1);
    const Tensor w = random_tensor({2 * n, k}, dtype(), kGpu, -0.05, 0.05);
    const PoisonedOut got(m, n, n, dtype());
    cuda_kernels::swiglu_gemm(x, w, got.out, stream());
    const Tensor y = linear(x, w);
    const Tensor want = swiglu(y.narrow(-1, 0, n), y.narrow(-1, n, n));
    cuda::synchronize(0);
    EXPECT_LE(testing::relative_error(got.out.to(Device::cpu()), want.to(Device::cpu())), testing::tolerance(dtype()));
    EXPECT_EQ(got.written_outside(), 0);
  }
}

// rms_norm_linear with SwiGLU at prefill size takes the kernel, and equals the separate ops.
TEST_P(SwigluGemmCudaTest, RmsNormLinearTakesItAtPrefillSize) {
  const int64_t m = 2100, k = 256, n = 320;
  ASSERT_TRUE(cuda_kernels::swiglu_gemm_pays(m));
  EXPECT_FALSE(cuda_kernels::swiglu_gemm_pays(512));
  const Tensor x = random_tensor({m, k}, dtype(), kGpu), residual = random_tensor({m, k}, dtype(), kGpu);
  const Tensor gamma = random_tensor({k}, dtype(), kGpu, 0.5, 1.5);
  const Tensor w = random_tensor({2 * n, k}, dtype(), kGpu, -0.1, 0.1);
  ASSERT_TRUE(cuda_kernels::swiglu_gemm_takes(x, w, Tensor::empty({m, n}, dtype(), kGpu)));
  NormLinearResult fused, composed;
  {
    const FusedSetting on(true);
    fused = rms_norm_linear(x, residual, gamma, 1e-6, w, Tensor(), GatedActivation::swiglu);
  }
  {
    const FusedSetting off(false);
    composed = rms_norm_linear(x, residual, gamma, 1e-6, w, Tensor(), GatedActivation::swiglu);
  }
  EXPECT_LE(testing::relative_error(fused.out.to(Device::cpu()), composed.out.to(Device::cpu())),
            testing::tolerance(dtype()));
  // The kernel ran: the same bits as the kernel itself on rms_norm's output (the composition's differ).
  const Tensor normed = rms_norm_residual(x, residual, gamma, 1e-6).out;
  const Tensor direct = Tensor::empty({m, n}, dtype(), kGpu);
  cuda_kernels::swiglu_gemm(normed, w, direct, stream());
  EXPECT_EQ(testing::host_values(fused.out.to(Device::cpu())), testing::host_values(direct.to(Device::cpu())));
  EXPECT_EQ(testing::host_values(fused.h.to(Device::cpu())), testing::host_values(composed.h.to(Device::cpu())));
}

// Captured in a CUDA graph (as the engine's prefill chunks are: launches chained, the kernel waiting on the device
// for rms_norm before it reads x) and replayed on new inputs written into the same buffers: the same bits as the
// op run eagerly on them.
TEST_P(SwigluGemmCudaTest, ReplaysInsideACudaGraph) {
  const int64_t m = 2048, k = 256, n = 192;
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  Tensor x, residual, gamma, w;
  NormLinearResult y;
  {
    const cuda::StreamGuard guard(stream);
    x = random_tensor({m, k}, dtype(), kGpu);
    residual = random_tensor({m, k}, dtype(), kGpu);
    gamma = random_tensor({k}, dtype(), kGpu, 0.5, 1.5);
    w = random_tensor({2 * n, k}, dtype(), kGpu, -0.1, 0.1);
  }
  stream.synchronize();
  cuda::Graph graph =
      cuda::Graph::capture(stream, pool, [&] {
        y = rms_norm_linear(x, residual, gamma, 1e-6, w, Tensor(), GatedActivation::swiglu);
      });
  for (int replay = 0; replay < 2; ++replay) {
    const Tensor fresh = random_tensor({m, k}, dtype(), Device::cpu());
    {
      const cuda::StreamGuard guard(stream);
      x.copy_(fresh.to(kGpu));
      y.out.copy_(Tensor::full(y.out.shape(), std::numeric_limits<double>::quiet_NaN(), dtype(), kGpu));
    }
    graph.replay();
    stream.synchronize();
    const NormLinearResult eager = rms_norm_linear(x, residual, gamma, 1e-6, w, Tensor(), GatedActivation::swiglu);
    EXPECT_EQ(testing::host_values(y.out.to(Device::cpu())), testing::host_values(eager.out.to(Device::cpu())))
        << "replay " << replay;
  }
  graph = cuda::Graph();
  y = NormLinearResult();
  cuda::release_graph_pool(0, pool);
}

TEST_P(SwigluGemmCudaTest, RefusesWhatItDoesNotTake) {
  auto takes = [&](int64_t m, int64_t k, int64_t n, DType dt, int64_t w_rows = -1) {
    const Tensor x = Tensor::empty({m, k}, dt, kGpu);
    const Tensor w = Tensor::empty({w_rows < 0 ? 2 * n : w_rows, k}, dt, kGpu);
    return cuda_kernels::swiglu_gemm_takes(x, w, Tensor::empty({m, n}, dt, kGpu));
  };
  EXPECT_TRUE(takes(256, 64, 64, dtype()));
  EXPECT_TRUE(takes(1, 64, 64, dtype()));          // any row count (rms_norm_linear asks swiglu_gemm_pays too)
  EXPECT_FALSE(takes(256, 60, 64, dtype()));       // k % 8
  EXPECT_FALSE(takes(256, 64, 60, dtype()));       // n % 8
  EXPECT_FALSE(takes(256, 64, 64, dtype(), 100));  // w is not [2n, k]
  EXPECT_FALSE(takes(256, 64, 64, DType::f32));    // 16-bit only
  EXPECT_FALSE(takes(256, 0, 64, dtype()));        // no k: the composition (zeros) handles it
  EXPECT_FALSE(cuda_kernels::swiglu_gemm_takes(Tensor::empty({256, 64}, dtype()), Tensor::empty({128, 64}, dtype()),
                                               Tensor::empty({256, 64}, dtype())));  // CPU tensors
  const Tensor x = Tensor::empty({256, 72}, dtype(), kGpu).narrow(1, 0, 64);  // rows 144 bytes apart: 9 units
  EXPECT_TRUE(cuda_kernels::swiglu_gemm_takes(x, Tensor::empty({128, 64}, dtype(), kGpu),
                                              Tensor::empty({256, 64}, dtype(), kGpu)));
  const Tensor odd = Tensor::empty({256, 68}, dtype(), kGpu).narrow(1, 0, 64);  // rows 136 bytes apart
  EXPECT_FALSE(cuda_kernels::swiglu_gemm_takes(odd, Tensor::empty({128, 64}, dtype(), kGpu),
                                               Tensor::empty({256, 64}, dtype(), kGpu)));
  // out: the epilogue stores 16-byte chunks, so rows 4 bytes apart past a multiple of 16, or a base off 16 bytes, are
  // refused (rows 136 bytes apart; a base 4 bytes in).
  const Tensor w = Tensor::empty({128, 64}, dtype(), kGpu), x64 = Tensor::empty({256, 64}, dtype(), kGpu);
  EXPECT_FALSE(cuda_kernels::swiglu_gemm_takes(x64, w, Tensor::empty({256, 68}, dtype(), kGpu).narrow(1, 0, 64)));
  EXPECT_FALSE(cuda_kernels::swiglu_gemm_takes(x64, w, Tensor::empty({256, 72}, dtype(), kGpu).narrow(1, 2, 64)));
  EXPECT_TRUE(cuda_kernels::swiglu_gemm_takes(x64, w, Tensor::empty({256, 72}, dtype(), kGpu).narrow(1, 0, 64)));
  EXPECT_THROW(cuda_kernels::swiglu_gemm(odd, Tensor::empty({128, 64}, dtype(), kGpu),
                                         Tensor::empty({256, 64}, dtype(), kGpu), stream()),
               ShapeError);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwigluGemmCudaTest, ::testing::Values(DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm

#endif  // MICROLLM_WITH_CUDA
