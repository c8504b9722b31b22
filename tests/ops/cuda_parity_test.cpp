// Every op on CUDA against the CPU reference on the same fresh random inputs (odd shapes, strided
// views, the model's layouts), with the Standards' bounds (relative error <= 1e-5 f32, <= 1e-2
// bf16/f16), and proof that no op moves data between host and device (the transfer counters).
// The per-family tests (TEST_P over both devices) check each device against f64 references; this file
// checks the devices against each other and the no-transfer rule. Skips without a GPU.
#include <gtest/gtest.h>

#include <functional>

#include "microllm/backend/backend.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;
using Tensors = std::vector<Tensor>;
using OpFn = std::function<Tensors(const Tensors&)>;

struct ParityCase {
  std::string name;
  Tensors inputs;  // on the CPU
  OpFn run;
};

std::vector<Tensor> to_device(const Tensors& xs, Device device) {
  Tensors out;
  for (const Tensor& x : xs) out.push_back(x.to(device));
  return out;
}

void expect_parity(const ParityCase& c, DType dtype) {
  SCOPED_TRACE(c.name + " " + dtype_name(dtype));
  const Tensors cpu_out = c.run(c.inputs);
  const Tensors gpu_in = to_device(c.inputs, Device::cuda(0));
  cuda::synchronize(0);
  cuda::reset_transfer_stats();
  const Tensors gpu_out = c.run(gpu_in);
  cuda::synchronize(0);
  const cuda::TransferStats moved = cuda::transfer_stats();
  EXPECT_EQ(moved.host_to_device, 0u) << "the op copied host -> device";
  EXPECT_EQ(moved.device_to_host, 0u) << "the op copied device -> host";
  ASSERT_EQ(cpu_out.size(), gpu_out.size());
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    ASSERT_EQ(gpu_out[i].device(), Device::cuda(0)) << "output " << i;
    ASSERT_EQ(gpu_out[i].shape(), cpu_out[i].shape()) << "output " << i;
    ASSERT_EQ(gpu_out[i].dtype(), cpu_out[i].dtype()) << "output " << i;
    const Tensor got = gpu_out[i].to(Device::cpu());
    if (is_integral(got.dtype())) {
      EXPECT_EQ(got.to_vector<int64_t>(), cpu_out[i].to_vector<int64_t>()) << "output " << i;
    } else {
      const double tol = std::max(testing::tolerance(dtype), testing::tolerance(got.dtype()));
      EXPECT_LE(testing::relative_error(got, cpu_out[i]), tol) << "output " << i;
    }
  }
}

class CudaParityTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0)); }
  DType dtype() const { return GetParam(); }
  Tensor rand(const Shape& s, double lo = -2, double hi = 2) { return random_tensor(s, dtype(), Device::cpu(), lo, hi); }
};

TEST_P(CudaParityTest, Elementwise) {
  const Tensor x = rand({37, 129}), y = rand({7, 1}, 0.5, 2), z = rand({5, 1, 129});
  const Tensor mask = Tensor::from_vector<uint8_t>({1, 0, 0, 1, 1, 0, 1}, {7, 1});
  for (const ParityCase& c : std::vector<ParityCase>{
           {"silu+exp+gelu", {x}, [](const Tensors& in) { return Tensors{silu(in[0]), exp(in[0]), gelu(in[0], true)}; }},
           {"unary_backward", {x, x}, [](const Tensors& in) { return Tensors{unary_backward(UnaryOp::silu, in[0], in[1])}; }},
           {"broadcast binary", {z, y}, [](const Tensors& in) { return Tensors{add(in[0], in[1]), div(in[0], in[1]), gt(in[0], in[1])}; }},
           {"transposed input", {x}, [](const Tensors& in) { return Tensors{mul(in[0].t(), in[0].t())}; }},
           {"where", {mask, y, z}, [](const Tensors& in) {
              const Tensor w = where(in[0], in[1], in[2]);  // [5, 7, 129]
              return Tensors{w, masked_fill(w, in[0], -1)};
            }},
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, ReductionsAndIndexing) {
  const Tensor x = rand({9, 33, 65});
  const Tensor logits = rand({3, 151936}, -10, 10);
  const Tensor weight = rand({1000, 96});
  const Tensor ids = Tensor::from_vector<int64_t>({3, 999, 0, 3, 17, 512, 3, 1}, {2, 4});
  for (const ParityCase& c : std::vector<ParityCase>{
           // (A sum over all 19305 elements is left to ReduceTest's f64 reference: two f32 summation orders
           // legitimately differ by more than 1e-5 there.)
           {"sum/mean/max", {x}, [](const Tensors& in) { return Tensors{sum(in[0], {1}), mean(in[0], {0, 2}), max(in[0], -1)}; }},
           {"argmax", {x}, [](const Tensors& in) { return Tensors{argmax(in[0], 1), argmax(in[0])}; }},
           {"topk vocab", {logits}, [](const Tensors& in) { auto r = topk(in[0], 50); return Tensors{r.values, r.indices}; }},
           {"topk transposed", {x}, [](const Tensors& in) { auto r = topk(in[0].transpose(1, 2), 7); return Tensors{r.values, r.indices}; }},
           {"embedding", {weight, ids}, [](const Tensors& in) { return Tensors{embedding(in[0], in[1])}; }},
           {"embedding_backward", {rand({2, 4, 96}), ids}, [](const Tensors& in) { return Tensors{embedding_backward(in[0], in[1], 1000)}; }},
           {"concat/split", {x}, [](const Tensors& in) { auto parts = split(in[0], {10, 23}, 1); return Tensors{concat({parts[1], parts[0]}, 1)}; }},
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, MatmulAndLinear) {
  const Tensor a = rand({3, 65, 96}), b = rand({96, 130}), w = rand({130, 96}), bias = rand({130});
  for (const ParityCase& c : std::vector<ParityCase>{
           {"batched broadcast", {a, b}, [](const Tensors& in) { return Tensors{matmul(in[0], in[1])}; }},
           {"transposed b", {a, w}, [](const Tensors& in) { return Tensors{matmul(in[0], in[1], false, true)}; }},
           {"transposed a", {a, a}, [](const Tensors& in) { return Tensors{matmul(in[0], in[1], true, false)}; }},
           {"linear + bias", {a, w, bias}, [](const Tensors& in) { return Tensors{linear(in[0], in[1], in[2])}; }},
           // Decode-sized rows (m <= 8), one and several, with and without bias, a strided row view, k not a
           // multiple of 8.
           {"linear, one row", {rand({1, 1, 96}), w, bias}, [](const Tensors& in) { return Tensors{linear(in[0], in[1], in[2])}; }},
           {"linear, 5 rows", {rand({5, 96}), w}, [](const Tensors& in) { return Tensors{linear(in[0], in[1])}; }},
           {"linear, 8 strided rows", {rand({8, 3, 96}), w, bias}, [](const Tensors& in) { return Tensors{linear(in[0].select(1, 2), in[1], in[2])}; }},
           {"linear, k 99", {rand({2, 99}), rand({130, 99})}, [](const Tensors& in) { return Tensors{linear(in[0], in[1])}; }},
           {"linear, wide", {rand({3, 256}), rand({4099, 256}), rand({4099})}, [](const Tensors& in) { return Tensors{linear(in[0], in[1], in[2])}; }},
           {"linear_backward", {a, w, rand({3, 65, 130})}, [](const Tensors& in) {
              auto g = linear_backward(in[0], in[1], true, in[2]);
              return Tensors{g.grad_x, g.grad_weight, g.grad_bias};
            }},
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, NormRopeSwigluSoftmax) {
  const Tensor x = rand({3, 17, 896}), r = rand({3, 17, 896}), w = rand({896}, 0.5, 1.5);
  const Tensor q = rand({2, 19, 14, 64}), qkv = rand({2, 19, 18, 64});
  const Tensor positions = Tensor::arange(5, 24, 1, DType::i64);
  const Tensor logits = rand({5, 33, 257});
  for (const ParityCase& c : std::vector<ParityCase>{
           {"rms_norm_residual", {x, r, w}, [](const Tensors& in) {
              auto res = rms_norm_residual(in[0], in[1], in[2], 1e-6);
              return Tensors{res.out, res.h, res.rstd};
            }},
           {"rms_norm_backward", {x, w, r}, [](const Tensors& in) {
              auto fwd = rms_norm_with_stats(in[0], in[1], 1e-6);
              auto g = rms_norm_backward(in[2], in[0], in[1], fwd.rstd);
              return Tensors{g.grad_h, g.grad_weight};
            }},
           {"rope", {q, positions}, [](const Tensors& in) {
              const RopeParams p{1e6, RopeLayout::split_half, {}};
              return Tensors{rope(in[0], in[1], p), rope_backward(in[0], in[1], p)};
            }},
           {"rope of q and k in a fused qkv row", {qkv, positions}, [](const Tensors& in) {
              const RopeParams p{1e6, RopeLayout::split_half, {}};
              return Tensors{rope(in[0].narrow(2, 0, 16), in[1], p)};  // 16 of 18 heads: strided rows
            }},
           {"rope llama3 interleaved", {q, positions}, [](const Tensors& in) {
              RopeParams p{5e5, RopeLayout::interleaved, {RopeScalingType::llama3, 8, 1, 4, 8192}};
              return Tensors{rope(in[0], in[1], p)};
            }},
           {"swiglu", {x, r, w}, [](const Tensors& in) {
              auto g = swiglu_backward(in[0], in[1], in[0]);
              return Tensors{swiglu(in[0], in[1]), g.grad_gate, g.grad_up};
            }},
           {"softmax", {logits}, [](const Tensors& in) {
              const Tensor y = softmax(in[0]), ly = log_softmax(in[0], 1);
              return Tensors{y, ly, softmax_backward(y, in[0]), log_softmax_backward(ly, in[0], 1)};
            }},
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, AttentionPathsAndCrossEntropy) {
  // Prefill in the model's layout ([B, T, H, D] transposed): the flash path for bf16/f16 at D 64 and 128.
  const Tensor q64 = rand({2, 130, 14, 64}, -1, 1), k64 = rand({2, 130, 2, 64}, -1, 1), v64 = rand({2, 130, 2, 64}, -1, 1);
  const Tensor q128 = rand({1, 70, 12, 128}, -1, 1), k128 = rand({1, 70, 2, 128}, -1, 1), v128 = rand({1, 70, 2, 128}, -1, 1);
  // Decode: one query row against a long cache.
  const Tensor qd = rand({3, 14, 1, 64}, -1, 1), kd = rand({3, 2, 700, 64}, -1, 1), vd = rand({3, 2, 700, 64}, -1, 1);
  const Tensor logits = rand({67, 5003}, -5, 5);
  std::vector<int64_t> t(67);
  for (size_t i = 0; i < t.size(); ++i) t[i] = (i % 9 == 4) ? -100 : static_cast<int64_t>((i * 7919) % 5003);
  const Tensor targets = Tensor::from_vector(t, {67});
  auto fwd_bwd = [](const Tensors& in) {
    const Tensor q = in[0].transpose(1, 2), k = in[1].transpose(1, 2), v = in[2].transpose(1, 2);
    const AttentionResult r = attention(q, k, v);
    const AttentionGrads g = attention_backward(q, k, v, r, in[3].transpose(1, 2));
    return Tensors{r.out, r.lse, g.grad_q, g.grad_k, g.grad_v};
  };
  for (const ParityCase& c : std::vector<ParityCase>{
           {"attention d64", {q64, k64, v64, rand({2, 130, 14, 64}, -1, 1)}, fwd_bwd},
           {"attention d128", {q128, k128, v128, rand({1, 70, 12, 128}, -1, 1)}, fwd_bwd},
           {"decode", {qd, kd, vd}, [](const Tensors& in) {
              AttentionParams p;
              p.q_offset = 699;
              const AttentionResult r = attention(in[0], in[1], in[2], p);
              return Tensors{r.out, r.lse};
            }},
           {"cross_entropy", {logits, targets}, [](const Tensors& in) {
              const Tensor loss = cross_entropy(in[0], in[1]);
              const Tensor g = cross_entropy_backward(in[0], in[1], Tensor::full({}, 0.5, DType::f32, in[0].device()));
              return Tensors{loss, g};
            }},
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, AttentionEdgeCases) {
  // Inputs: q, k, v, grad_out in [B, T, H, D], and optionally the mask (moved with the inputs).
  auto fwd_bwd = [](AttentionParams p) {
    return [p](const Tensors& in) {
      const Tensor q = in[0].transpose(1, 2), k = in[1].transpose(1, 2), v = in[2].transpose(1, 2);
      const Tensor m = in.size() > 4 ? in[4] : Tensor();
      const AttentionResult r = attention(q, k, v, p, m);
      const AttentionGrads g = attention_backward(q, k, v, r, in[3].transpose(1, 2), p, m);
      return Tensors{r.out, r.lse, g.grad_q, g.grad_k, g.grad_v};
    };
  };
  AttentionParams chunked;  // chunked prefill: 40 new queries after 90 cached keys
  chunked.q_offset = 90;
  AttentionParams full;  // not causal
  full.causal = false;
  // A masked decode: three query rows, D 128, one row that sees nothing.
  std::vector<uint8_t> mask_values(3 * 300, 1);
  for (int j = 0; j < 300; ++j) mask_values[2 * 300 + j] = 0;
  for (int j = 0; j < 300; j += 7) mask_values[j] = 0;
  const Tensor mask = Tensor::from_vector(mask_values, {1, 1, 3, 300});
  AttentionParams decode;
  decode.q_offset = 297;
  AttentionParams late_chunk;  // a prefill chunk late in a long prompt
  late_chunk.q_offset = 1000;
  // Sliding windows: the flash kernels start each query block at its first row's first key.
  auto windowed = [](int64_t window, int64_t q_offset) {
    AttentionParams p;
    p.window = window;
    p.q_offset = q_offset;
    return p;
  };
  // Queries of t rows and keys of s, q and grad_out [batch, t, q_heads, d], k and v [batch, s, kv_heads, d].
  auto heads = [&](std::string name, int64_t batch, int64_t t, int64_t s, int64_t q_heads, int64_t kv_heads,
                   int64_t d, const AttentionParams& p, const Tensor& m = Tensor()) {
    Tensors in{rand({batch, t, q_heads, d}, -1, 1), rand({batch, s, kv_heads, d}, -1, 1),
               rand({batch, s, kv_heads, d}, -1, 1), rand({batch, t, q_heads, d}, -1, 1)};
    if (m.defined()) in.push_back(m);
    return ParityCase{std::move(name), std::move(in), fwd_bwd(p)};
  };
  AttentionParams short_decode;
  short_decode.q_offset = 49;
  for (const ParityCase& c : std::vector<ParityCase>{
           heads("flash q_offset", 2, 40, 130, 14, 2, 64, chunked),
           heads("flash non-causal", 1, 77, 77, 12, 2, 128, full),
           heads("flash one split", 8, 1200, 1200, 4, 2, 64, AttentionParams{}),
           // Too few query blocks to fill the GPU: the forward splits their keys over several CTAs and merges
           // them (attention_flash_fwd.cu; these shapes split on any GPU of 36 SMs or more).
           heads("flash split keys d128", 1, 1024, 1024, 2, 1, 128, AttentionParams{}),
           heads("flash split keys q_offset", 1, 200, 1200, 4, 2, 64, late_chunk),
           heads("flash split keys non-causal", 1, 100, 1500, 2, 2, 128, full),
           heads("flash window 100 d128", 1, 300, 300, 12, 2, 128, windowed(100, 0)),
           // With 64-key tiles its blocks of 5 tiles split while the last block, 2 rows long, reads 4 and does not.
           heads("flash window 190, split keys, short last block", 1, 1410, 1410, 4, 2, 64, windowed(190, 0)),
           heads("flash window after cached keys", 2, 150, 400, 12, 2, 128, windowed(100, 250)),
           heads("flash window past every row (none)", 1, 130, 130, 4, 2, 64, windowed(130, 0)),
           // Gemma 3's head dim (the forward on the mma.sync kernel on any GPU, the backward one CTA an SM): a local
           // layer's window and a global layer's split keys.
           heads("flash d256 window 512", 1, 700, 700, 4, 1, 256, windowed(512, 0)),
           heads("flash d256 split keys", 1, 1024, 1024, 4, 1, 256, AttentionParams{}),
           // Phi-3's head dim: the forward on tiles of 128 (the columns past 96 zero in shared memory, never stored),
           // the backward on the reference kernel.
           heads("flash d96 window 64", 2, 200, 200, 4, 4, 96, windowed(64, 0)),
           heads("flash d96 split keys", 1, 1024, 1024, 2, 2, 96, AttentionParams{}),
           heads("decode window 50 d128", 2, 3, 300, 4, 2, 128, windowed(50, 297)),
           heads("decode masked d128", 2, 3, 300, 4, 2, 128, decode, mask),
           heads("decode d40", 3, 1, 50, 6, 3, 40, short_decode),
       }) {
    expect_parity(c, dtype());
  }
}

TEST_P(CudaParityTest, FlashBackwardIsBitwiseRepeatableAndAgreesWithTheAtomicMode) {
  if (dtype() == DType::f32) GTEST_SKIP() << "the flash kernels take bf16/f16";
  const testing::ScopedSwitch restore(deterministic_algorithms, set_deterministic_algorithms, true);
  AttentionParams chunked;  // causal with a query offset: the dQ part sums must stop at each row's last block
  chunked.q_offset = 100;
  AttentionParams windowed;  // and under a window start at its first
  windowed.window = 100;
  for (const AttentionParams& p : {AttentionParams{}, chunked, windowed}) {
    const int64_t t = p.q_offset > 0 ? 90 : 333;
    const Device gpu = Device::cuda(0);
    const Tensor q = rand({2, t, 8, 64}, -1, 1).to(gpu).transpose(1, 2);
    const Tensor k = rand({2, t + p.q_offset, 2, 64}, -1, 1).to(gpu).transpose(1, 2);
    const Tensor v = rand({2, t + p.q_offset, 2, 64}, -1, 1).to(gpu).transpose(1, 2);
    const Tensor grad_out = rand({2, t, 8, 64}, -1, 1).to(gpu).transpose(1, 2);
    const AttentionResult fwd = attention(q, k, v, p);
    auto backward = [&](bool deterministic) {
      set_deterministic_algorithms(deterministic);
      const AttentionGrads g = attention_backward(q, k, v, fwd, grad_out, p);
      return Tensors{g.grad_q.to(Device::cpu()), g.grad_k.to(Device::cpu()), g.grad_v.to(Device::cpu())};
    };
    const Tensors first = backward(true), second = backward(true), atomic = backward(false);
    for (size_t i = 0; i < first.size(); ++i) {
      const Tensor a = first[i].to(DType::f32), b = second[i].to(DType::f32);
      EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << "gradient " << i << " differs between two runs";
      EXPECT_LE(testing::relative_error(atomic[i], first[i]), 1e-2) << "gradient " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaParityTest, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         testing::cuda_dtype_test_name);

}  // namespace
}  // namespace microllm
