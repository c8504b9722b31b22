// The flash attention forward's Hopper kernel (TMA + wgmma, src/backend/cuda/attention_flash_fwd_sm90.cu) against
// the kernel before it (mma.sync, attention_flash_fwd.cu: set_flash_wgmma(false)) and the CPU reference, on
// fresh random inputs with NaN-poisoned outputs and a guard band after them: causal and not, a query offset
// (a prefill chunk after cached keys), sliding windows, grouped heads, lengths that are not a multiple of any tile, blocks
// whose keys split over several CTAs, q, k and v as heads of one fused projection's rows, k and v broadcast
// across heads (stride 0), and the prefills of Qwen2.5-0.5B (D 64) and R1-Distill-1.5B (D 128); each kernel
// writes both a contiguous output and a token-major view (what ops::attention hands it), bit for bit the same.
// Skips without a GPU, and where the Hopper kernel does not run (not an sm_90 GPU, or no sm_90a code).
#include <gtest/gtest.h>

#ifdef MICROLLM_WITH_CUDA

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cuda/attention_kernels.h"
#include "microllm/backend/backend.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

const Device kGpu = Device::cuda(0);
constexpr int64_t kGuard = 64;  // poisoned elements after each output

// flash_wgmma() set for a scope.
struct WgmmaSetting : testing::ScopedSwitch {
  explicit WgmmaSetting(bool enabled) : ScopedSwitch(flash_wgmma, set_flash_wgmma, enabled) {}
};

// A NaN-filled buffer with `shape`'s elements and a guard band; `view` is the output.
struct Poisoned {
  Tensor buffer, view;
  Poisoned(const Shape& shape, DType dtype) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    buffer = Tensor::full({n + kGuard}, std::numeric_limits<double>::quiet_NaN(), dtype, kGpu);
    view = buffer.narrow(0, 0, n).view(shape);
  }
  bool guard_intact() const {
    for (double v : testing::host_values(buffer.narrow(0, view.numel(), kGuard).to(Device::cpu()))) {
      if (!std::isnan(v)) return false;
    }
    return true;
  }
};

struct Case {
  const char* name;
  int64_t batch, t, s, q_heads, kv_heads, d;
  AttentionParams params;
  bool cpu_reference;      // small enough for the CPU reference in a test
  bool fused_qkv = false;  // q, k and v are heads of one [B, L, Hq + 2 Hkv, D] buffer (a fused projection's)
  bool broadcast_kv = false;  // k and v are one head broadcast to kv_heads (a stride of 0 across heads)
};

AttentionParams causal_at(int64_t q_offset) {
  AttentionParams p;
  p.q_offset = q_offset;
  return p;
}
AttentionParams windowed(int64_t window, int64_t q_offset) {
  AttentionParams p;
  p.window = window;
  p.q_offset = q_offset;
  return p;
}
AttentionParams not_causal() {
  AttentionParams p;
  p.causal = false;
  return p;
}

class FlashForwardCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    MICROLLM_SKIP_IF_UNAVAILABLE(kGpu);
    const WgmmaSetting on(true);
    if (!cuda_kernels::attention::flash_forward_uses_wgmma(0)) {
      GTEST_SKIP() << "the Hopper flash kernel does not run here (not an sm_90 GPU, or no sm_90a code)";
    }
  }
  DType dtype() const { return GetParam(); }
};

TEST_P(FlashForwardCudaTest, HopperKernelMatchesTheMmaKernelAndTheCpuReference) {
  const std::vector<Case> cases = {
      {"d64 causal, GQA 7", 2, 130, 130, 14, 2, 64, AttentionParams{}, true},
      {"d128 causal, GQA 6", 1, 70, 70, 12, 2, 128, AttentionParams{}, true},
      {"d64 chunk after cached keys", 2, 40, 130, 14, 2, 64, causal_at(90), true},
      {"d128 not causal", 1, 77, 77, 12, 2, 128, not_causal(), true},
      {"d128 split keys", 1, 1024, 1024, 2, 1, 128, AttentionParams{}, true},
      {"d64 split keys, late chunk", 1, 200, 1200, 4, 2, 64, causal_at(1000), true},
      {"d128 split keys, not causal", 1, 100, 1500, 2, 2, 128, not_causal(), true},
      {"d64 one row", 3, 1, 333, 4, 4, 64, causal_at(332), true},
      {"d64 batch 8, odd length", 8, 777, 777, 4, 2, 64, AttentionParams{}, false},
      {"Qwen2.5-0.5B prefill", 1, 2048, 2048, 14, 2, 64, AttentionParams{}, false},
      {"R1-Distill-1.5B prefill", 1, 2048, 2048, 12, 2, 128, AttentionParams{}, false},
      {"d128 heads of one fused qkv buffer", 1, 300, 300, 12, 2, 128, AttentionParams{}, true, true},
      {"d64 heads of one fused qkv buffer, batch 2", 2, 257, 257, 14, 2, 64, AttentionParams{}, true, true},
      {"d128 one kv head broadcast to two", 2, 150, 150, 12, 2, 128, AttentionParams{}, true, false, true},
      {"d128 window 100", 1, 300, 300, 12, 2, 128, windowed(100, 0), true},
      {"d64 window 190, split keys, short last block", 1, 1410, 1410, 4, 2, 64, windowed(190, 0), true},
      {"d128 window 100 after cached keys", 2, 150, 400, 12, 2, 128, windowed(100, 250), true},
      {"d128 window 600, split keys", 1, 1100, 1100, 8, 2, 128, windowed(600, 0), true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // [B, H, L, D] views of [B, L, H, D] tensors on the GPU, the model's layout: the heads of one fused
    // projection's rows, or of three tensors (Tensor::to packs a view, so the views are taken after the move).
    Tensor q, k, v;
    if (c.fused_qkv) {
      const Tensor qkv =
          random_tensor({c.batch, c.t, c.q_heads + 2 * c.kv_heads, c.d}, dtype(), Device::cpu()).to(kGpu);
      q = qkv.narrow(2, 0, c.q_heads).transpose(1, 2);
      k = qkv.narrow(2, c.q_heads, c.kv_heads).transpose(1, 2);
      v = qkv.narrow(2, c.q_heads + c.kv_heads, c.kv_heads).transpose(1, 2);
    } else if (c.broadcast_kv) {
      const Shape kv_shape{c.batch, c.s, c.kv_heads, c.d};
      q = random_tensor({c.batch, c.t, c.q_heads, c.d}, dtype(), Device::cpu()).to(kGpu).transpose(1, 2);
      k = random_tensor({c.batch, c.s, 1, c.d}, dtype(), Device::cpu()).to(kGpu).expand(kv_shape).transpose(1, 2);
      v = random_tensor({c.batch, c.s, 1, c.d}, dtype(), Device::cpu()).to(kGpu).expand(kv_shape).transpose(1, 2);
    } else {
      q = random_tensor({c.batch, c.t, c.q_heads, c.d}, dtype(), Device::cpu()).to(kGpu).transpose(1, 2);
      k = random_tensor({c.batch, c.s, c.kv_heads, c.d}, dtype(), Device::cpu()).to(kGpu).transpose(1, 2);
      v = random_tensor({c.batch, c.s, c.kv_heads, c.d}, dtype(), Device::cpu()).to(kGpu).transpose(1, 2);
    }
    const Shape out_shape{c.batch, c.q_heads, c.t, c.d}, lse_shape{c.batch, c.q_heads, c.t};
    auto run = [&](bool wgmma) {
      const WgmmaSetting setting(wgmma);
      EXPECT_EQ(cuda_kernels::attention::flash_forward_uses_wgmma(0), wgmma);
      Poisoned out(out_shape, dtype()), lse(lse_shape, DType::f32);
      backend_for(kGpu).attention(q, k, v, Tensor(), c.params, out.view, lse.view);
      // The same into a [B, H, T, D] view of [B, T, H, D] memory: only the rows' addresses differ.
      Poisoned token_major({c.batch, c.t, c.q_heads, c.d}, dtype()), lse_again(lse_shape, DType::f32);
      backend_for(kGpu).attention(q, k, v, Tensor(), c.params, token_major.view.transpose(1, 2), lse_again.view);
      cuda::synchronize(0);
      EXPECT_TRUE(out.guard_intact()) << "a write past the output";
      EXPECT_TRUE(lse.guard_intact()) << "a write past lse";
      EXPECT_TRUE(token_major.guard_intact()) << "a write past the token-major output";
      const AttentionResult result{out.view.to(Device::cpu()), lse.view.to(Device::cpu())};
      EXPECT_EQ(testing::host_values(token_major.view.transpose(1, 2).to(Device::cpu())),
                testing::host_values(result.out))
          << "the token-major output differs from the contiguous one";
      return result;
    };
    const AttentionResult hopper = run(true), mma = run(false);
    // The two kernels tile differently (64- vs 128-row blocks, other splits), so P is rounded to 16 bits
    // against other running maxima: they agree to the storage type's tolerance, not bit for bit.
    MICROLLM_EXPECT_CLOSE(hopper.out, mma.out, testing::tolerance(dtype()));
    MICROLLM_EXPECT_CLOSE(hopper.lse, mma.lse, 1e-5);
    if (c.cpu_reference) {
      const AttentionResult ref = attention(q.to(Device::cpu()), k.to(Device::cpu()), v.to(Device::cpu()), c.params);
      MICROLLM_EXPECT_CLOSE(hopper.out, ref.out, testing::tolerance(dtype()));
      MICROLLM_EXPECT_CLOSE(hopper.lse, ref.lse, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashForwardCudaTest, ::testing::Values(DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm

#endif  // MICROLLM_WITH_CUDA
