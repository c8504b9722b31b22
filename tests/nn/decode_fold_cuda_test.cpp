// A bf16 model's decode steps on CUDA, where the RMSNorms and SwiGLU fold into the decode GEMV
// (ops/norm_linear.h, src/backend/cuda/gemv.cu: one or two rows), against the same steps with the GEMV off
// (the separate rms_norm, cuBLASLt and swiglu kernels): the logits agree within bf16's rounding, for
// Qwen2-like layers (qkv bias) and Qwen3-like ones (QK-norm), batch 1 and 2, several steps (so the residual
// stream the fold writes feeds the next layer and step). Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "microllm/autograd/variable.h"
#include "microllm/backend/backend.h"
#include "microllm/nn/transformer.h"
#include "test_support.h"

namespace microllm::nn {
namespace {

const Device kGpu = Device::cuda(0);

TransformerConfig small_config(bool qwen3) {
  TransformerConfig c;
  c.model_type = qwen3 ? "qwen3" : "qwen2";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 136;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.attention_bias = !qwen3;
  c.qk_norm = qwen3;
  c.initializer_range = 0.2;
  c.max_position_embeddings = 64;
  return c;
}

// The logits of a 5-token prefill then `steps` one-token decode steps, [batch, vocab] per decode step.
std::vector<Tensor> decode_logits(const TransformerLM& model, const Tensor& prompt, const std::vector<Tensor>& next,
                                  bool gemv) {
  const testing::ScopedSwitch setting(decode_gemv, set_decode_gemv, gemv);
  autograd::NoGradGuard no_grad;
  KvCache cache(model.config(), prompt.size(0), 16, DType::bf16, kGpu);
  ForwardContext ctx;
  ctx.compute_dtype = DType::bf16;
  ctx.cache = &cache;
  model.forward(prompt, ctx);
  std::vector<Tensor> logits;
  for (const Tensor& ids : next) logits.push_back(model.forward(ids, ctx).value().select(1, 0).to(Device::cpu()));
  return logits;
}

TEST(DecodeFoldCudaTest, LogitsEqualTheSeparateKernels) {
  MICROLLM_SKIP_IF_UNAVAILABLE(kGpu);
  for (bool qwen3 : {false, true}) {
    for (int64_t batch : {1, 2}) {
      SCOPED_TRACE(str_cat(qwen3 ? "qwen3" : "qwen2", " batch ", batch));
      TransformerLM model(small_config(qwen3), testing::fresh_seed());
      model.to(kGpu);
      model.to(DType::bf16);
      model.fuse_projections();
      Generator gen(testing::fresh_seed());
      auto ids = [&](int64_t tokens) {
        std::vector<int64_t> v(static_cast<size_t>(batch * tokens));
        for (int64_t& id : v) id = static_cast<int64_t>(gen.next_below(97));
        return Tensor::from_vector(v, {batch, tokens}, kGpu);
      };
      const Tensor prompt = ids(5);
      const std::vector<Tensor> next = {ids(1), ids(1), ids(1)};
      const std::vector<Tensor> folded = decode_logits(model, prompt, next, true);
      const std::vector<Tensor> separate = decode_logits(model, prompt, next, false);
      for (size_t step = 0; step < next.size(); ++step) {
        // Two bf16 computations that sum in different orders: a few 1e-3 apart; a wrong row or a lost residual
        // stream moves the logits by O(1).
        EXPECT_LE(testing::relative_error(folded[step], separate[step]), 5e-2) << "decode step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace microllm::nn
