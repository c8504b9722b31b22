// Sliding-window attention through every inference path: a random Mistral-style model whose window (4 keys) is far
// shorter than the text generates the same greedy tokens through the training graph (full forwards), generate()
// over the contiguous KV cache, and the serving engine's paged cache (chunked prefill, batched decode). The window
// changes the logits, so a path that ignored it would differ; so do Gemma 3's block and yarn's rotary scaling.
// transformers' own logits for such models are the golden tests (tools/oracle).
#include <gtest/gtest.h>

#include <cmath>

#include "microllm/autograd/variable.h"
#include "microllm/generate/engine.h"
#include "microllm/generate/generate.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/reduce.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

nn::TransformerConfig windowed_config(int64_t window) {
  nn::TransformerConfig c;
  c.model_type = "mistral";
  c.vocab_size = 97, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.max_position_embeddings = 128, c.initializer_range = 0.2;
  c.rope.theta = 10000;
  c.sliding_window = window;
  c.sliding_layers = {true, false};  // layer 0 slides, layer 1 sees everything (Gemma-style interleaving)
  return c;
}

Tensor last_logits(const nn::TransformerLM& model, const std::vector<int32_t>& ids) {
  autograd::NoGradGuard no_grad;
  nn::ForwardContext ctx;
  ctx.compute_dtype = DType::f64;
  const Tensor logits = model.forward(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}), ctx).value();
  return logits.select(1, logits.size(1) - 1).select(0, 0);
}

std::vector<int32_t> training_graph_greedy(const nn::TransformerLM& model, std::vector<int32_t> ids, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto next = static_cast<int32_t>(argmax(last_logits(model, ids), -1).to_vector<int64_t>()[0]);
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 3, 88, 41, 9, 60, 2, 33}, {71, 12, 4}};

// The largest logit difference after prompt 0 between a model of `config` and one of `plain` with the same seed:
// what the config's features change (a path that ignored them would give the plain logits).
double feature_effect(const nn::TransformerConfig& config, const nn::TransformerConfig& plain, uint64_t seed) {
  nn::TransformerLM a(config, seed), b(plain, seed);
  a.to(DType::f64);
  b.to(DType::f64);
  const std::vector<double> x = testing::host_values(last_logits(a, kPrompts[0]));
  const std::vector<double> y = testing::host_values(last_logits(b, kPrompts[0]));
  double largest = 0;
  for (size_t i = 0; i < x.size(); ++i) largest = std::max(largest, std::abs(x[i] - y[i]));
  return largest;
}

// The same greedy tokens from the training graph (full forwards), generate() and the serving engine.
void expect_every_path_agrees(const nn::TransformerConfig& config, uint64_t seed) {
  nn::TransformerLM model(config, seed);
  model.to(DType::f64);
  const std::vector<std::vector<int32_t>>& prompts = kPrompts;
  const int64_t n = 14;
  std::vector<std::vector<int32_t>> reference;
  for (const auto& prompt : prompts) reference.push_back(training_graph_greedy(model, prompt, n));

  GenerateOptions options;
  options.max_new_tokens = n;
  options.sampling.temperature = 0;
  options.compute_dtype = DType::f64;
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(generate(model, prompts[i], options), reference[i]) << i;

  model.fuse_projections();
  Engine engine(model, {.max_batch = 2, .prefill_chunk = 4, .dtype = DType::f64});
  std::vector<std::vector<int32_t>> served(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest request;
    request.prompt = prompts[i];
    request.max_new_tokens = n;
    request.sampling.temperature = 0;
    request.on_finish = [&served, i](const Generation& g) { served[i] = g.tokens; };
    engine.submit(request);
  }
  engine.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(served[i], reference[i]) << "engine, prompt " << i;
}

TEST(SlidingWindow, TrainingGraphGenerateAndTheEngineAgree) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // The window matters here: the same weights without it give other logits after the window fills.
  EXPECT_GT(feature_effect(windowed_config(4), windowed_config(0), seed), 1e-3)
      << "the window does not change the logits: the test could not fail";
  expect_every_path_agrees(windowed_config(4), seed);
}

// Gemma 3's block (sandwich norms, QK-norm, GELU-tanh, scaled embeddings, query_pre_attn_scalar, the sliding layers'
// own rotary base, soft-capped logits) and yarn's rotary scaling, through every path.
TEST(FamilyFeatures, GemmaBlockAndYarnRunTheSameOnEveryPath) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  nn::TransformerConfig gemma = windowed_config(4);
  gemma.model_type = "gemma3_text";
  gemma.norm_placement = nn::NormPlacement::sandwich;
  gemma.qk_norm = true;
  gemma.mlp_activation = nn::MlpActivation::gelu_tanh;
  gemma.head_dim = 12;
  gemma.embedding_scale = std::sqrt(32.0);
  gemma.query_pre_attn_scalar = 20;
  gemma.final_logit_softcap = 3.0;
  gemma.rope.theta = 1e6;
  gemma.sliding_rope = RopeParams{};
  gemma.sliding_rope->theta = 100;
  for (auto change :
       std::vector<void (*)(nn::TransformerConfig&)>{[](nn::TransformerConfig& c) { c.embedding_scale = 1; },
                                                     [](nn::TransformerConfig& c) { c.query_pre_attn_scalar = 0; },
                                                     [](nn::TransformerConfig& c) { c.final_logit_softcap = 0; },
                                                     [](nn::TransformerConfig& c) { c.sliding_rope.reset(); }}) {
    nn::TransformerConfig plain = gemma;
    change(plain);
    EXPECT_GT(feature_effect(gemma, plain, seed), 1e-3) << "a feature that does not change the logits";
  }
  expect_every_path_agrees(gemma, seed);

  nn::TransformerConfig yarn = windowed_config(0);
  yarn.model_type = "qwen2";
  yarn.rope.scaling.type = RopeScalingType::yarn;
  yarn.rope.scaling.factor = 4;
  yarn.rope.scaling.original_max_position_embeddings = 16;
  EXPECT_GT(feature_effect(yarn, windowed_config(0), seed), 1e-3);
  expect_every_path_agrees(yarn, seed);
}

}  // namespace
}  // namespace microllm::generate
