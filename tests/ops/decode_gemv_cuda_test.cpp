// The decode GEMV (src/backend/cuda/gemv.cu): out = x @ w^T (+ bias) for m <= 8 rows, bf16/f16, against the
// CPU reference on fresh random inputs (odd m, k and n, a row-strided x, NaN-poisoned outputs with a guard
// band after them), against cuBLASLt (decode_gemv() off) at the projections of Qwen2.5-0.5B and
// DeepSeek-R1-Distill-Qwen-1.5B, with the RMSNorms and each gate folded in, with linear_add's addend, inside a CUDA
// graph, and the m = 9 hand-over to cuBLASLt. Skips without a GPU.
#include <gtest/gtest.h>

#ifdef MICROLLM_WITH_CUDA

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/gemv.h"
#include "microllm/backend/backend.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

const Device kGpu = Device::cuda(0);
constexpr int64_t kGuard = 64;  // poisoned elements after the output: a write past [m, n] shows there

// decode_gemv() set for a scope.
struct GemvSetting : testing::ScopedSwitch {
  explicit GemvSetting(bool enabled) : ScopedSwitch(decode_gemv, set_decode_gemv, enabled) {}
};

// A NaN-filled buffer of m * n + kGuard elements; out is its first m * n as a contiguous [m, n].
struct PoisonedOut {
  Tensor buffer, out;
  PoisonedOut(int64_t m, int64_t n, DType dtype)
      : buffer(Tensor::full({m * n + kGuard}, std::numeric_limits<double>::quiet_NaN(), dtype, kGpu)),
        out(buffer.narrow(0, 0, m * n).view({m, n})) {}
  // Every guard element is still NaN.
  bool guard_intact() const {
    for (double v : testing::host_values(buffer.narrow(0, out.numel(), kGuard).to(Device::cpu()))) {
      if (!std::isnan(v)) return false;
    }
    return true;
  }
};

class DecodeGemvCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(kGpu); }
  DType dtype() const { return GetParam(); }
  double tol() const { return testing::tolerance(dtype()); }
  Tensor rand(const Shape& s) { return random_tensor(s, dtype(), Device::cpu(), -1, 1); }
};

// Runs the GEMV itself (not through matmul's dispatch), so a case it refused would fail here instead of
// passing through cuBLASLt unnoticed.
void run_gemv(const Tensor& x, const Tensor& w, const Tensor& bias, const PoisonedOut& out) {
  const bool taken = cuda_kernels::try_decode_gemv(
      x, w, bias.defined() ? bias.data_ptr() : nullptr, bias.defined() ? bias.stride(0) : 0, out.out,
      static_cast<cudaStream_t>(cuda::current_stream(0).handle()));
  ASSERT_TRUE(taken) << "the GEMV refused x " << x.shape() << " strides " << x.strides() << ", w " << w.shape();
  cuda::synchronize(0);
}

// m <= 2 stages x in shared memory (kMaxStagedPlainRows), m > 2 reads it from global memory: both paths, with
// the strided x showing a staging that ignored x's row stride.
TEST_P(DecodeGemvCudaTest, MatchesTheCpuReference) {
  const GemvSetting on(true);
  for (int64_t m : {1, 2, 3, 5, 8}) {
    for (int64_t k : {8, 200, 896, 4864}) {
      for (int64_t n : {1, 7, 129, 1152}) {
        for (bool with_bias : {false, true}) {
          for (bool strided_x : {false, true}) {
            SCOPED_TRACE(str_cat("m ", m, " k ", k, " n ", n, with_bias ? " bias" : "", strided_x ? " strided x" : ""));
            const Tensor x_cpu = rand({m, k}), w_cpu = rand({n, k});
            const Tensor bias_cpu = with_bias ? rand({n}) : Tensor();
            // A strided x: columns 8..k+7 of a NaN-filled [m, k + 24] (16-byte aligned, rows k + 24 apart),
            // so a read outside the view (past k in the last chunk, say) turns the result into NaN.
            Tensor x_gpu = x_cpu.to(kGpu);
            if (strided_x) {
              x_gpu = Tensor::full({m, k + 24}, std::numeric_limits<double>::quiet_NaN(), dtype(), kGpu).narrow(1, 8, k);
              x_gpu.copy_(x_cpu.to(kGpu));
            }
            const PoisonedOut out(m, n, dtype());
            run_gemv(x_gpu, w_cpu.to(kGpu), with_bias ? bias_cpu.to(kGpu) : Tensor(), out);
            if (HasFatalFailure()) return;
            const Tensor ref = linear(x_cpu, w_cpu, bias_cpu);
            EXPECT_LE(testing::relative_error(out.out.to(Device::cpu()), ref), tol());
            EXPECT_TRUE(out.guard_intact()) << "the GEMV wrote past its output";
          }
        }
      }
    }
  }
}

// Through linear(), as the model calls it: the GEMV and cuBLASLt (decode_gemv() off) agree with each other
// and with the CPU at the projections of both models, m = 1 and 8.
TEST_P(DecodeGemvCudaTest, AgreesWithCublasLtAtTheModelShapes) {
  struct Shape2 {
    const char* name;
    int64_t n, k;
    bool bias;
  };
  const Shape2 shapes[] = {{"0.5b qkv", 1152, 896, true},   {"0.5b o", 896, 896, false},
                           {"0.5b gate_up", 9728, 896, false}, {"0.5b down", 896, 4864, false},
                           {"1.5b qkv", 2048, 1536, true},   {"1.5b o", 1536, 1536, false},
                           {"1.5b gate_up", 17920, 1536, false}, {"1.5b down", 1536, 8960, false}};
  for (const Shape2& s : shapes) {
    for (int64_t m : {1, 8}) {
      SCOPED_TRACE(str_cat(s.name, " m ", m));
      const Tensor x_cpu = rand({m, s.k}), w_cpu = random_tensor({s.n, s.k}, dtype(), Device::cpu(), -0.05, 0.05);
      const Tensor bias_cpu = s.bias ? rand({s.n}) : Tensor();
      const Tensor x = x_cpu.to(kGpu), w = w_cpu.to(kGpu), bias = s.bias ? bias_cpu.to(kGpu) : Tensor();
      Tensor gemv, cublaslt;
      {
        const GemvSetting on(true);
        gemv = linear(x, w, bias).to(Device::cpu());
      }
      {
        const GemvSetting off(false);
        cublaslt = linear(x, w, bias).to(Device::cpu());
      }
      const Tensor ref = linear(x_cpu, w_cpu, bias_cpu);
      EXPECT_LE(testing::relative_error(gemv, ref), tol()) << "GEMV vs CPU";
      EXPECT_LE(testing::relative_error(cublaslt, ref), tol()) << "cuBLASLt vs CPU";
      EXPECT_LE(testing::relative_error(gemv, cublaslt), tol()) << "GEMV vs cuBLASLt";
    }
  }
}

// The residual added in the epilogue (linear_add's addend: a decode layer's o and down projections), called
// directly so that a refusal fails here: against the CPU's linear_add, nothing written past the output, and
// against cuBLASLt's beta = 1 (GEMV off) through linear_add.
TEST_P(DecodeGemvCudaTest, AddsTheAddendBeforeItsRounding) {
  const GemvSetting on(true);
  for (int64_t m : {1, 2, 8}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{896, 896}, {896, 4864}, {1536, 1536}, {129, 200}}) {
      SCOPED_TRACE(str_cat("m ", m, " n ", n, " k ", k));
      const Tensor x_cpu = rand({m, k}), w_cpu = random_tensor({n, k}, dtype(), Device::cpu(), -0.05, 0.05);
      const Tensor addend_cpu = rand({m, n}), bias_cpu = rand({n});
      const Tensor x = x_cpu.to(kGpu), w = w_cpu.to(kGpu), addend = addend_cpu.to(kGpu), bias = bias_cpu.to(kGpu);
      const PoisonedOut out(m, n, dtype());
      ASSERT_TRUE(cuda_kernels::try_decode_gemv(x, w, bias.data_ptr(), 1, out.out,
                                                static_cast<cudaStream_t>(cuda::current_stream(0).handle()), nullptr,
                                                GatedActivation::none, nullptr, addend.data_ptr()));
      cuda::synchronize(0);
      const Tensor ref = linear_add(x_cpu, w_cpu, bias_cpu, addend_cpu);
      const Tensor gemv = out.out.to(Device::cpu());
      EXPECT_LE(testing::relative_error(gemv, ref), tol()) << "GEMV vs CPU";
      EXPECT_TRUE(out.guard_intact()) << "the GEMV wrote past its output";
      const GemvSetting off(false);
      EXPECT_LE(testing::relative_error(linear_add(x, w, bias, addend).to(Device::cpu()), gemv), tol())
          << "GEMV vs cuBLASLt";
    }
  }
}

// The RMSNorms (with and without the residual add, with and without x's own norm before it) and each gate folded
// into the GEMV, called directly (so a case it refused fails here): out against the CPU's separate ops, h
// bit-identical where it is one rounded add (within tolerance after x's own norm), nothing written past either.
TEST_P(DecodeGemvCudaTest, FoldsTheRmsNormsAndTheGate) {
  const GemvSetting on(true);
  constexpr double kEps = 1e-6;
  for (int64_t m : {1, 2}) {  // the rows the folded GEMV takes (gemv.cu: kMaxFoldedRows)
    for (int64_t k : {64, 640, 896, 1536}) {  // 640: Gemma 3 270M's hidden size
      for (bool with_residual : {false, true}) {
        for (GatedActivation gate : {GatedActivation::none, GatedActivation::swiglu, GatedActivation::geglu}) {
          for (bool x_normed : {false, true}) {
            const bool gated = gate != GatedActivation::none;
            const int64_t n = gated ? (k == 640 ? 2048 : 4864) : 1152;
            SCOPED_TRACE(str_cat("m ", m, " k ", k, " n ", n, with_residual ? " residual" : "", " gate ",
                                 gated_activation_name(gate), x_normed ? " x normed" : ""));
            const Tensor x_cpu = rand({m, k}), residual_cpu = rand({m, k});
            const Tensor gamma_cpu = random_tensor({k}, dtype(), Device::cpu(), 0.5, 1.5);
            const Tensor x_gamma_cpu = random_tensor({k}, dtype(), Device::cpu(), 0.5, 1.5);
            const Tensor w_cpu = random_tensor({gated ? 2 * n : n, k}, dtype(), Device::cpu(), -0.1, 0.1);
            const Tensor bias_cpu = gated ? Tensor() : rand({n});
            const bool writes_h = with_residual || x_normed;
            const PoisonedOut out(m, n, dtype()), h(m, k, dtype());
            cuda_kernels::GemvNorm norm{with_residual ? residual_cpu.to(kGpu) : Tensor(), gamma_cpu.to(kGpu), kEps,
                                        writes_h ? h.out : Tensor(), x_normed ? x_gamma_cpu.to(kGpu) : Tensor()};
            const Tensor bias = bias_cpu.defined() ? bias_cpu.to(kGpu) : Tensor();
            ASSERT_TRUE(cuda_kernels::try_decode_gemv(x_cpu.to(kGpu), w_cpu.to(kGpu),
                                                      bias.defined() ? bias.data_ptr() : nullptr, 1, out.out,
                                                      static_cast<cudaStream_t>(cuda::current_stream(0).handle()),
                                                      &norm, gate));
            cuda::synchronize(0);
            const Tensor input = x_normed ? rms_norm(x_cpu, x_gamma_cpu, kEps) : x_cpu;
            Tensor normed, h_ref = input;
            if (with_residual) {
              const RmsNormResult r = rms_norm_residual(input, residual_cpu, gamma_cpu, kEps);
              normed = r.out;
              h_ref = r.h;
            } else {
              normed = rms_norm(input, gamma_cpu, kEps);
            }
            Tensor ref = linear(normed, w_cpu, bias_cpu);
            if (gate == GatedActivation::swiglu) ref = microllm::swiglu(ref.narrow(1, 0, n), ref.narrow(1, n, n));
            if (gate == GatedActivation::geglu) {
              ref = mul(gelu(ref.narrow(1, 0, n), /*tanh_approximation=*/true), ref.narrow(1, n, n));
            }
            EXPECT_LE(testing::relative_error(out.out.to(Device::cpu()), ref), tol());
            EXPECT_TRUE(out.guard_intact()) << "the GEMV wrote past its output";
            if (x_normed) {  // x's own norm sums its squares in the kernel's order
              EXPECT_LE(testing::relative_error(h.out.to(Device::cpu()), h_ref), tol()) << "h";
            } else if (with_residual) {
              EXPECT_EQ(testing::host_values(h.out.to(Device::cpu())), testing::host_values(h_ref)) << "h";
            }
            if (writes_h) {
              EXPECT_TRUE(h.guard_intact()) << "the GEMV wrote past h";
            }
          }
        }
      }
    }
  }
  // Three rows: every CTA would normalize them all (gemv.cu: kMaxFoldedRows), so the folded GEMV declines
  // (rms_norm_linear then runs the separate kernels) and launches nothing.
  const PoisonedOut refused(3, 1152, dtype());
  const cuda_kernels::GemvNorm norm{Tensor(), rand({896}).to(kGpu), kEps, Tensor(), Tensor()};
  EXPECT_FALSE(cuda_kernels::try_decode_gemv(rand({3, 896}).to(kGpu), rand({1152, 896}).to(kGpu), nullptr, 0,
                                             refused.out, static_cast<cudaStream_t>(cuda::current_stream(0).handle()),
                                             &norm));
  cuda::synchronize(0);
  EXPECT_TRUE(std::isnan(testing::host_values(refused.out.narrow(0, 0, 1).narrow(1, 0, 1).to(Device::cpu()))[0]));
}

// A row folded beside another (m = 2) gives the bits it gives alone (m = 1), h and out: the RMSNorm's sum of
// squares must not be added in an order that depends on m or on the row (batched decoding equals each request
// alone). k 1,536: two of a thread's packs a row.
TEST_P(DecodeGemvCudaTest, FoldedRowsGiveTheirBitsAlone) {
  const GemvSetting on(true);
  constexpr double kEps = 1e-6;
  const cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle());
  for (int64_t k : {896, 1536}) {
    for (GatedActivation gate : {GatedActivation::none, GatedActivation::swiglu, GatedActivation::geglu}) {
      for (bool x_normed : {false, true}) {
        SCOPED_TRACE(str_cat("k ", k, " gate ", gated_activation_name(gate), x_normed ? " x normed" : ""));
        const int64_t n = gate != GatedActivation::none ? 4864 : 1152;
        const Tensor x = rand({2, k}).to(kGpu), residual = rand({2, k}).to(kGpu);
        const Tensor gamma = random_tensor({k}, dtype(), Device::cpu(), 0.5, 1.5).to(kGpu);
        const Tensor x_gamma = x_normed ? random_tensor({k}, dtype(), Device::cpu(), 0.5, 1.5).to(kGpu) : Tensor();
        const Tensor w =
            random_tensor({gate != GatedActivation::none ? 2 * n : n, k}, dtype(), Device::cpu(), -0.1, 0.1).to(kGpu);
        auto run = [&](const Tensor& xs, const Tensor& rs) {
          const int64_t m = xs.size(0);
          const PoisonedOut out(m, n, dtype()), h(m, k, dtype());
          const cuda_kernels::GemvNorm norm{rs, gamma, kEps, h.out, x_gamma};
          EXPECT_TRUE(cuda_kernels::try_decode_gemv(xs, w, nullptr, 0, out.out, stream, &norm, gate));
          cuda::synchronize(0);
          return std::pair{testing::host_values(out.out.to(Device::cpu())),
                           testing::host_values(h.out.to(Device::cpu()))};
        };
        const auto [both_out, both_h] = run(x, residual);
        for (int64_t r : {0, 1}) {
          const auto [row_out, row_h] = run(x.narrow(0, r, 1).contiguous(), residual.narrow(0, r, 1).contiguous());
          const std::vector<double> out_r(both_out.begin() + r * n, both_out.begin() + (r + 1) * n);
          const std::vector<double> h_r(both_h.begin() + r * k, both_h.begin() + (r + 1) * k);
          EXPECT_EQ(out_r, row_out) << "row " << r << ": out";
          EXPECT_EQ(h_r, row_h) << "row " << r << ": h";
        }
      }
    }
  }
}

// Nine rows are past the GEMV: it declines, and matmul's cuBLASLt path gives the right answer.
TEST_P(DecodeGemvCudaTest, NineRowsGoToCublasLt) {
  const GemvSetting on(true);
  const Tensor x_cpu = rand({9, 896}), w_cpu = rand({1152, 896}), bias_cpu = rand({1152});
  const Tensor x = x_cpu.to(kGpu), w = w_cpu.to(kGpu), bias = bias_cpu.to(kGpu);
  const PoisonedOut refused(9, 1152, dtype());
  EXPECT_FALSE(cuda_kernels::try_decode_gemv(x, w, bias.data_ptr(), 1, refused.out,
                                             static_cast<cudaStream_t>(cuda::current_stream(0).handle())));
  cuda::synchronize(0);
  EXPECT_TRUE(std::isnan(testing::host_values(refused.out.narrow(0, 0, 1).narrow(1, 0, 1).to(Device::cpu()))[0]))
      << "a refused call must launch nothing";
  const PoisonedOut out(9, 1152, dtype());
  backend_for(kGpu).matmul(x, w, false, true, bias, Tensor(), out.out);
  EXPECT_LE(testing::relative_error(out.out.to(Device::cpu()), linear(x_cpu, w_cpu, bias_cpu)), tol());
  EXPECT_TRUE(out.guard_intact());
}

// Captured in a CUDA graph (as the engine's decode steps are) and replayed on new inputs written into the
// same buffers: the replay computes with them.
TEST_P(DecodeGemvCudaTest, ReplaysInsideACudaGraph) {
  const GemvSetting on(true);
  const cuda::Stream stream = cuda::Stream::create(0);
  const uint64_t pool = cuda::create_graph_pool();
  const Tensor w_cpu = rand({896, 4864}), bias_cpu = rand({896});
  Tensor x, w, bias, y;
  {
    const cuda::StreamGuard guard(stream);
    x = rand({4, 4864}).to(kGpu);
    w = w_cpu.to(kGpu);
    bias = bias_cpu.to(kGpu);
  }
  stream.synchronize();
  cuda::Graph graph = cuda::Graph::capture(stream, pool, [&] { y = linear(x, w, bias); });
  for (int replay = 0; replay < 2; ++replay) {
    const Tensor x_cpu = rand({4, 4864});
    {
      const cuda::StreamGuard guard(stream);
      x.copy_(x_cpu.to(kGpu));
      y.copy_(Tensor::full(y.shape(), std::numeric_limits<double>::quiet_NaN(), dtype(), kGpu));
    }
    graph.replay();
    stream.synchronize();
    EXPECT_LE(testing::relative_error(y.to(Device::cpu()), linear(x_cpu, w_cpu, bias_cpu)), tol()) << "replay " << replay;
  }
  graph = cuda::Graph();
  y = Tensor();
  cuda::release_graph_pool(0, pool);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecodeGemvCudaTest, ::testing::Values(DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm

#endif  // MICROLLM_WITH_CUDA
