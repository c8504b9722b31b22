// nn modules (the training graph): Hugging Face parameter names, parameter counts, the loss of a fresh model,
// gradients that reach every parameter (checked against finite differences in f64), mixed precision, fused
// projections keeping names and values, and the sandwich block with GeGLU. The inference runner over these
// weights is tests/generate/runner_test.cpp.
#include "microllm/nn/transformer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "microllm/core/memory.h"

#include "microllm/autograd/functions.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm::nn {
namespace {

TransformerConfig small_config(bool qwen3_style) {
  TransformerConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = qwen3_style ? 6 : 0;  // explicit head_dim different from hidden / heads
  c.qk_norm = qwen3_style;
  c.attention_bias = !qwen3_style;
  c.tie_word_embeddings = !qwen3_style;
  c.rope.theta = 1000;
  c.initializer_range = 0.3;
  return c;
}

Tensor random_ids(int64_t batch, int64_t tokens, int64_t vocab, uint64_t seed) {
  return testing::random_tensor({batch, tokens}, DType::i64, Device::cpu(), 0, static_cast<double>(vocab), seed);
}

TEST(Transformer, HuggingFaceNamesAndCounts) {
  TransformerLM qwen2(small_config(false), 1);
  std::vector<std::string> names;
  for (const auto& p : qwen2.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.1.self_attn.q_proj.bias"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.0.mlp.down_proj.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.norm.weight"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());  // tied
  TransformerLM qwen3(small_config(true), 1);
  EXPECT_NE(qwen3.find_parameter("model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_NE(qwen3.find_parameter("lm_head.weight"), nullptr);
  EXPECT_EQ(qwen3.find_parameter("model.layers.0.self_attn.q_proj.weight")->shape(), (Shape{4 * 6, 8}));
  // Presets land near their advertised sizes at a byte vocabulary.
  EXPECT_NEAR(TransformerLM(TransformerConfig::preset("tiny", 256), 0).num_parameters() / 1e6, 1.0, 0.1);
  EXPECT_THROW(TransformerConfig::preset("huge", 256), ValueError);
}

TEST(Transformer, FreshModelPredictsNearUniformAndEveryParameterGetsAGradient) {
  TransformerConfig c = TransformerConfig::preset("tiny", 256);
  TransformerLM model(c, 3);
  const Tensor ids = random_ids(2, 16, 256, 5), targets = random_ids(2, 16, 256, 6);
  ForwardContext ctx;
  const autograd::Variable loss = model.loss(ids, targets, ctx);
  EXPECT_NEAR(loss.value().item<double>(), std::log(256.0), 0.05);
  loss.backward();
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.variable->grad().defined()) << p.name << " got no gradient";
    EXPECT_GT(microllm::sum(microllm::square(p.variable->grad())).item<double>(), 0) << p.name;
  }
}

// Finite differences on a handful of elements of every parameter, in f64.
void expect_model_gradients_match(const TransformerConfig& config) {
  TransformerLM model(config, 7);
  model.to(DType::f64);
  ForwardContext ctx;
  ctx.compute_dtype = DType::f64;
  const Tensor ids = random_ids(2, 5, 11, 8);
  Tensor targets = random_ids(2, 5, 11, 9);
  targets.data<int64_t>()[3] = -100;
  model.loss(ids, targets, ctx).backward();
  const double eps = 1e-6;
  for (const auto& p : model.named_parameters()) {
    Tensor& value = const_cast<Tensor&>(p.variable->value());
    const std::vector<double> analytic = p.variable->grad().to_vector<double>();
    for (int64_t i : {int64_t{0}, value.numel() / 2, value.numel() - 1}) {
      double* element = value.data<double>() + i;
      const double saved = *element;
      autograd::NoGradGuard no_grad;
      *element = saved + eps;
      const double plus = model.loss(ids, targets, ctx).value().item<double>();
      *element = saved - eps;
      const double minus = model.loss(ids, targets, ctx).value().item<double>();
      *element = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(analytic[static_cast<size_t>(i)], numeric, 1e-6 * (1 + std::abs(numeric))) << p.name << "[" << i << "]";
    }
  }
}

// A block no shipped family has (the family description's other options): sandwich norms and GeGLU.
TransformerConfig sandwich_config() {
  TransformerConfig c = small_config(false);
  c.norm_placement = NormPlacement::sandwich;
  c.mlp_activation = MlpActivation::gelu_tanh;
  return c;
}

TEST(Transformer, GradientsMatchFiniteDifferencesQwen2Style) { expect_model_gradients_match(small_config(false)); }
TEST(Transformer, GradientsMatchFiniteDifferencesQwen3Style) { expect_model_gradients_match(small_config(true)); }
TEST(Transformer, GradientsMatchFiniteDifferencesSandwichGeglu) { expect_model_gradients_match(sandwich_config()); }

// The sandwich block: four norms with Gemma's names, each in the forward (a norm's weight changes the logits).
TEST(Transformer, SandwichBlocksHaveFourNormsEachInUse) {
  TransformerLM model(sandwich_config(), 5);
  EXPECT_EQ(model.num_parameters(), sandwich_config().num_parameters());
  const Tensor ids = random_ids(1, 6, 11, 3);
  autograd::NoGradGuard no_grad;
  const Tensor before = model.forward(ids, ForwardContext()).value();
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"}) {
    const std::string name = std::string("model.layers.1.") + norm + ".weight";
    autograd::Variable* w = model.find_parameter(name);
    ASSERT_NE(w, nullptr) << name;
    Tensor& value = const_cast<Tensor&>(w->value());
    const Tensor saved = value.clone();
    value.copy_(testing::random_tensor(value.shape(), DType::f32, Device::cpu(), 0.5, 1.5));
    EXPECT_GT(testing::relative_error(model.forward(ids, ForwardContext()).value(), before), 1e-3) << name;
    value.copy_(saved);
  }
}

TEST(Transformer, MixedPrecisionKeepsF32MastersAndF32Gradients) {
  TransformerLM model(TransformerConfig::preset("tiny", 256), 3);
  ForwardContext ctx;
  ctx.compute_dtype = DType::bf16;
  const Tensor ids = random_ids(2, 8, 256, 1), targets = random_ids(2, 8, 256, 2);
  const autograd::Variable loss = model.loss(ids, targets, ctx);
  EXPECT_NEAR(loss.value().item<double>(), std::log(256.0), 0.1);
  loss.backward();
  for (const auto& p : model.named_parameters()) {
    EXPECT_EQ(p.variable->value().dtype(), DType::f32) << p.name;
    EXPECT_EQ(p.variable->grad().dtype(), DType::f32) << p.name;
  }
}

TEST(Transformer, FusedProjectionsGiveTheSameLogitsAndKeepNamesAndValues) {
  for (bool qwen3_style : {false, true}) {
    TransformerLM model(small_config(qwen3_style), 21);
    const Tensor ids = random_ids(2, 7, 11, 22);
    autograd::NoGradGuard no_grad;
    const Tensor expected = model.forward(ids, ForwardContext()).value();
    std::vector<std::pair<std::string, std::vector<float>>> before;
    for (const ParameterInfo& p : model.named_parameters()) before.emplace_back(p.name, p.variable->value().to_vector<float>());
    model.fuse_projections();
    const auto after = model.named_parameters();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].name, before[i].first);
      EXPECT_EQ(after[i].variable->value().to_vector<float>(), before[i].second) << after[i].name;
    }
    // q/k/v (and their biases) and gate/up now share one buffer each.
    const auto find = [&](const std::string& name) -> const Tensor& {
      for (const ParameterInfo& p : after) {
        if (p.name == name) return p.variable->value();
      }
      throw std::runtime_error("no parameter " + name);
    };
    EXPECT_TRUE(find("model.layers.1.self_attn.q_proj.weight").shares_storage_with(find("model.layers.1.self_attn.v_proj.weight")));
    EXPECT_TRUE(find("model.layers.0.mlp.gate_proj.weight").shares_storage_with(find("model.layers.0.mlp.up_proj.weight")));
    EXPECT_LE(testing::relative_error(model.forward(ids, ForwardContext()).value(), expected), 1e-6)
        << (qwen3_style ? "qwen3" : "qwen2");
  }
}

TEST(Transformer, ParametersAreChargedAsWeights) {
  const auto weights_live = [] { return memory_usage(Device::cpu()).live[static_cast<size_t>(MemoryCategory::weights)]; };
  const int64_t weights = weights_live();
  nn::TransformerConfig c;
  c.vocab_size = 32, c.hidden_size = 16, c.intermediate_size = 32, c.num_layers = 1, c.num_heads = 2;
  c.num_kv_heads = 1;
  nn::TransformerLM model(c, 1);
  EXPECT_EQ(weights_live() - weights, model.num_parameters() * 4);
}

}  // namespace
}  // namespace microllm::nn
