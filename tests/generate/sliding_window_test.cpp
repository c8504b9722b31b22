// Sliding-window attention through every inference path: a random Mistral-style model whose window (4 keys) is far
// shorter than the text generates the same greedy tokens through the training graph (full forwards), generate()
// over the contiguous KV cache, and the serving engine's paged cache (chunked prefill, batched decode). The window
// changes the logits, so a path that ignored it would differ. transformers' own logits for such a model are the
// golden test (tools/oracle).
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

TEST(SlidingWindow, TrainingGraphGenerateAndTheEngineAgree) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  nn::TransformerLM model(windowed_config(4), seed);
  model.to(DType::f64);
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 88, 41, 9, 60, 2, 33}, {71, 12, 4}};
  const int64_t n = 14;

  // The window matters here: the same weights without it give other logits after the window fills.
  nn::TransformerConfig full_config = windowed_config(0);
  nn::TransformerLM full(full_config, seed);
  full.to(DType::f64);
  const std::vector<double> windowed = testing::host_values(last_logits(model, prompts[0]));
  const std::vector<double> unwindowed = testing::host_values(last_logits(full, prompts[0]));
  double largest = 0;
  for (size_t i = 0; i < windowed.size(); ++i) largest = std::max(largest, std::abs(windowed[i] - unwindowed[i]));
  EXPECT_GT(largest, 1e-3) << "the window does not change the logits: the test could not fail";

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

}  // namespace
}  // namespace microllm::generate
