// Activation taps (nn/taps.h) and attention weights: every point named in forward order with its shape, patterns,
// a forward unchanged by taps, values that compose into each other (q after the rotary embedding is the rotary of
// q_proj, the attention output is the weights times v, ...), gradients that are the loss's at each point, and CUDA
// equal to the CPU. transformers' own values at the same points: tests/models/align_golden_test.cpp.
#include "microllm/nn/taps.h"

#include <gtest/gtest.h>

#include <cmath>

#include "microllm/autograd/functions.h"
#include "microllm/core/cuda.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm::nn {
namespace {

TransformerConfig config_of(bool qwen3_style, NormPlacement placement = NormPlacement::pre) {
  TransformerConfig c;
  c.vocab_size = 13;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = qwen3_style ? 6 : 0;
  c.qk_norm = qwen3_style;
  c.attention_bias = !qwen3_style;
  c.tie_word_embeddings = qwen3_style;
  c.rope.theta = 1000;
  c.initializer_range = 0.4;
  c.norm_placement = placement;
  if (placement == NormPlacement::sandwich) c.mlp_activation = MlpActivation::gelu_tanh;
  return c;
}

Tensor random_ids(int64_t batch, int64_t tokens, int64_t vocab) {
  return testing::random_tensor({batch, tokens}, DType::i64, Device::cpu(), 0, static_cast<double>(vocab));
}

std::vector<std::string> names_of(const std::vector<TapRecord>& records) {
  std::vector<std::string> names;
  for (const TapRecord& r : records) names.push_back(r.name);
  return names;
}

Tensor host(const Tensor& t) { return t.to(Device::cpu(), DType::f32).contiguous(); }

TEST(Taps, EveryPointInForwardOrderWithItsShape) {
  const TransformerConfig c = config_of(/*qwen3_style=*/true);
  TransformerLM model(c, 3);
  Taps taps;
  ForwardContext ctx;
  ctx.taps = &taps;
  autograd::NoGradGuard no_grad;
  model.forward(random_ids(2, 5, c.vocab_size), ctx);

  std::vector<std::string> expected{"model.embed_tokens"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    for (const char* point :
         {".input_layernorm", ".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.q_norm",
          ".self_attn.k_norm", ".self_attn.q_rotary", ".self_attn.k_rotary", ".self_attn.o_proj.input",
          ".self_attn.o_proj", ".attention_residual", ".post_attention_layernorm", ".mlp.gate_proj", ".mlp.up_proj",
          ".mlp.down_proj.input", ".mlp", ""}) {
      expected.push_back(p + point);
    }
  }
  expected.push_back("model.norm");
  expected.push_back("logits");
  EXPECT_EQ(names_of(taps.values()), expected);
  EXPECT_TRUE(taps.gradients().empty());

  EXPECT_EQ(taps.value("model.embed_tokens")->shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(taps.value("model.layers.0.self_attn.q_proj")->shape(), (Shape{2, 5, 4 * 6}));
  EXPECT_EQ(taps.value("model.layers.0.self_attn.k_norm")->shape(), (Shape{2, 5, 2, 6}));
  EXPECT_EQ(taps.value("model.layers.1.self_attn.q_rotary")->shape(), (Shape{2, 5, 4, 6}));
  EXPECT_EQ(taps.value("model.layers.1.self_attn.o_proj.input")->shape(), (Shape{2, 5, 4 * 6}));
  EXPECT_EQ(taps.value("model.layers.1.mlp.down_proj.input")->shape(), (Shape{2, 5, 12}));
  EXPECT_EQ(taps.value("logits")->shape(), (Shape{2, 5, 13}));
  EXPECT_EQ(taps.value("nowhere"), nullptr);
}

TEST(Taps, SandwichBlocksNameTheirFourNorms) {
  TransformerLM model(config_of(false, NormPlacement::sandwich), 4);
  Taps taps({"model.layers.1.*"});
  ForwardContext ctx;
  ctx.taps = &taps;
  autograd::NoGradGuard no_grad;
  model.forward(random_ids(1, 4, 13), ctx);
  const std::vector<std::string> names = names_of(taps.values());
  const std::vector<std::string> expected{
      "model.layers.1.input_layernorm", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
      "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.q_rotary", "model.layers.1.self_attn.k_rotary",
      "model.layers.1.self_attn.o_proj.input", "model.layers.1.self_attn.o_proj",
      "model.layers.1.post_attention_layernorm", "model.layers.1.attention_residual",
      "model.layers.1.pre_feedforward_layernorm", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
      "model.layers.1.mlp.down_proj.input", "model.layers.1.mlp", "model.layers.1.post_feedforward_layernorm"};
  EXPECT_EQ(names, expected);  // "model.layers.1" itself does not match "model.layers.1.*"
}

TEST(Taps, PatternsSelectAndAttentionWeightsOnlyWhenNamed) {
  EXPECT_TRUE(Taps().wants("model.layers.3.mlp"));
  EXPECT_FALSE(Taps().wants("model.layers.3.self_attn.attn_weights"));
  EXPECT_TRUE(Taps({"*.mlp"}).wants("model.layers.3.mlp"));
  EXPECT_FALSE(Taps({"*.mlp"}).wants("model.layers.3.mlp.up_proj"));
  EXPECT_TRUE(Taps({"model.layers.*.self_attn.q_*"}).wants("model.layers.10.self_attn.q_rotary"));
  EXPECT_FALSE(Taps({"model.layers.1*"}).wants("model.layers.2"));
  EXPECT_FALSE(Taps({"*"}).wants("model.layers.0.self_attn.attn_weights"));
  EXPECT_FALSE(Taps({"model.layers.0.*"}).wants("model.layers.0.self_attn.attn_weights"));
  EXPECT_TRUE(Taps({"*attn_weights"}).wants("model.layers.0.self_attn.attn_weights"));
  EXPECT_TRUE(Taps({"model.layers.0.self_attn.*"}).wants("model.layers.0.self_attn.attn_weights"));
  EXPECT_TRUE(Taps({"logits", "model.norm"}).wants("model.norm"));
  EXPECT_FALSE(Taps({"logits"}).wants("logit"));
}

// Taps read the forward; they must not change it (the summed residual stream they use differs from the fused
// (delta, residual) form only by rounding).
TEST(Taps, TheForwardIsUnchangedAndTheLogitsPointIsItsOutput) {
  for (bool qwen3_style : {false, true}) {
    const TransformerConfig c = config_of(qwen3_style);
    TransformerLM model(c, 5);
    const Tensor ids = random_ids(2, 6, c.vocab_size);
    autograd::NoGradGuard no_grad;
    const Tensor plain = model.forward(ids, ForwardContext()).value();
    Taps taps;
    ForwardContext ctx;
    ctx.taps = &taps;
    const Tensor tapped = model.forward(ids, ctx).value();
    MICROLLM_EXPECT_CLOSE(tapped, plain, 1e-6);
    MICROLLM_EXPECT_CLOSE(*taps.value("logits"), tapped, 0.0);
  }
}

// Each point is what the points before it make: the composition written out with the ops.
TEST(Taps, PointsComposeIntoEachOther) {
  const TransformerConfig c = config_of(/*qwen3_style=*/false);
  TransformerLM model(c, 6);
  const int64_t batch = 2, tokens = 7;
  Taps taps({"*", "*attn_weights"});
  ForwardContext ctx;
  ctx.taps = &taps;
  autograd::NoGradGuard no_grad;
  model.forward(random_ids(batch, tokens, c.vocab_size), ctx);
  auto at = [&](const std::string& name) { return *taps.value("model.layers.1." + name); };

  const Tensor positions = Tensor::arange(tokens);
  const Tensor q = at("self_attn.q_proj").reshape({batch, tokens, 4, 2});
  MICROLLM_EXPECT_CLOSE(at("self_attn.q_rotary"), rope(q, positions, c.rope), 1e-6);

  // o_proj's input is the weights times v, v's kv head shared by each pair of query heads.
  const Tensor weights = at("self_attn.attn_weights");  // [B, Hq, T, T]
  ASSERT_EQ(weights.shape(), (Shape{batch, 4, tokens, tokens}));
  const Tensor v = at("self_attn.v_proj").reshape({batch, tokens, 2, 1, 2}).expand({batch, tokens, 2, 2, 2})
                       .reshape({batch, tokens, 4, 2}).transpose(1, 2);  // [B, Hq, T, D]
  const Tensor out = matmul(weights, v.contiguous()).transpose(1, 2).reshape({batch, tokens, 8});
  MICROLLM_EXPECT_CLOSE(at("self_attn.o_proj.input"), out, 1e-5);

  MICROLLM_EXPECT_CLOSE(at("attention_residual"),
                        add(*taps.value("model.layers.0"), at("self_attn.o_proj")), 1e-6);
  MICROLLM_EXPECT_CLOSE(at("mlp.down_proj.input"), swiglu(at("mlp.gate_proj"), at("mlp.up_proj")), 1e-6);
  MICROLLM_EXPECT_CLOSE(*taps.value("model.layers.1"), add(at("attention_residual"), at("mlp")), 1e-6);
}

TEST(Taps, AttentionWeightsAreCausalRowsThatSumToOne) {
  const TransformerConfig c = config_of(/*qwen3_style=*/true);
  TransformerLM model(c, 7);
  const int64_t tokens = 6;
  const std::vector<Tensor> weights = attention_weights(model, random_ids(2, tokens, c.vocab_size), {1, 0});
  ASSERT_EQ(weights.size(), 2U);
  const Tensor w = host(weights[0]);
  ASSERT_EQ(w.shape(), (Shape{2, 4, tokens, tokens}));
  const std::vector<float> values = w.to_vector<float>();
  for (int64_t row = 0; row < 2 * 4 * tokens; ++row) {
    const int64_t query = row % tokens;
    double sum = 0;
    for (int64_t key = 0; key < tokens; ++key) {
      const float p = values[static_cast<size_t>(row * tokens + key)];
      if (key > query) {
        EXPECT_EQ(p, 0.0F) << "row " << row << " key " << key;
      }
      EXPECT_GE(p, 0.0F);
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << row;
  }
  EXPECT_THROW(attention_weights(model, random_ids(1, 3, c.vocab_size), {2}), IndexError);
}

// A hand-written softmax(q k^T / sqrt(D)) with a padding mask: the composition's reference.
TEST(Taps, AttentionWeightsOpEqualsTheDefinition) {
  const int64_t batch = 2, q_heads = 4, kv_heads = 2, tokens = 5, dim = 3;
  const Tensor q = testing::random_tensor({batch, q_heads, tokens, dim});
  const Tensor k = testing::random_tensor({batch, kv_heads, tokens, dim});
  Tensor mask = Tensor::ones({batch, 1, 1, tokens}, DType::u8);
  mask.data<uint8_t>()[0] = 0;  // sequence 0 pads its first token: its first query row sees no key
  const std::vector<float> got = host(attention_weights(q, k, AttentionParams{}, mask)).to_vector<float>();
  const std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      for (int64_t i = 0; i < tokens; ++i) {
        std::vector<double> scores(tokens, -INFINITY);
        double top = -INFINITY, total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (b == 0 && j == 0) continue;
          double s = 0;
          for (int64_t d = 0; d < dim; ++d) {
            s += qv[static_cast<size_t>(((b * q_heads + h) * tokens + i) * dim + d)] *
                 kv[static_cast<size_t>(((b * kv_heads + h / 2) * tokens + j) * dim + d)];
          }
          scores[j] = s / std::sqrt(static_cast<double>(dim));
          top = std::max(top, scores[j]);
        }
        for (double s : scores) total += std::isinf(s) ? 0 : std::exp(s - top);
        for (int64_t j = 0; j < tokens; ++j) {
          const double want = std::isinf(scores[j]) ? 0 : std::exp(scores[j] - top) / total;
          EXPECT_NEAR(got[static_cast<size_t>(((b * q_heads + h) * tokens + i) * tokens + j)], want, 1e-6)
              << "b " << b << " h " << h << " i " << i << " j " << j;
        }
      }
    }
  }
}

// backward() records the gradient of the loss at each point: at the logits (softmax - one-hot) / N, and at the
// embedding output the rows that the embedding weight's gradient sums.
TEST(Taps, GradientsAreTheLossGradientsAtEachPoint) {
  const TransformerConfig c = config_of(/*qwen3_style=*/false);  // untied: the embedding weight has one user
  TransformerLM model(c, 8);
  const int64_t batch = 2, tokens = 5, n = batch * tokens;
  const Tensor ids = random_ids(batch, tokens, c.vocab_size), targets = random_ids(batch, tokens, c.vocab_size);
  Taps taps;
  taps.with_gradients();
  ForwardContext ctx;
  ctx.taps = &taps;
  model.loss(ids, targets, ctx).backward();

  const std::vector<std::string> order = names_of(taps.gradients());
  ASSERT_EQ(order.size(), taps.values().size());
  EXPECT_EQ(order.front(), "logits");  // backward order: from the loss down
  EXPECT_EQ(order.back(), "model.embed_tokens");

  std::vector<float> probabilities = softmax(*taps.value("logits")).to_vector<float>();
  const std::vector<int64_t> target_values = targets.to_vector<int64_t>();
  std::vector<double> expected_logits_grad(probabilities.size());
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const auto row = static_cast<int64_t>(i) / c.vocab_size, column = static_cast<int64_t>(i) % c.vocab_size;
    expected_logits_grad[i] = (probabilities[i] - (target_values[row] == column ? 1.0 : 0.0)) / n;
  }
  EXPECT_LE(testing::relative_error(*taps.gradient("logits"), expected_logits_grad), 1e-6);

  const std::vector<float> embed_grad = taps.gradient("model.embed_tokens")->to_vector<float>();
  const std::vector<int64_t> id_values = ids.to_vector<int64_t>();
  std::vector<double> rows(static_cast<size_t>(c.vocab_size * c.hidden_size), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t d = 0; d < c.hidden_size; ++d) {
      rows[static_cast<size_t>(id_values[t] * c.hidden_size + d)] += embed_grad[static_cast<size_t>(t * c.hidden_size + d)];
    }
  }
  EXPECT_LE(testing::relative_error(model.find_parameter("model.embed_tokens.weight")->grad(), rows), 1e-6);

  // The gradient of the block input sums both of its users: the residual and the input norm.
  EXPECT_TRUE(taps.gradient("model.layers.0.attention_residual") != nullptr);
  const Tensor& h0 = *taps.gradient("model.layers.0");
  const Tensor& residual_grad = *taps.gradient("model.layers.1.attention_residual");
  EXPECT_GT(testing::relative_error(h0, residual_grad), 1e-3);  // the norm's share is in h0, not only the residual
}

TEST(Taps, CallbacksSeeEachPointInsteadOfCopies) {
  const TransformerConfig c = config_of(false);
  TransformerLM model(c, 9);
  std::vector<std::string> seen;
  Taps taps({"model.norm", "logits"});
  taps.on_value([&](const std::string& name, const Tensor& t) { seen.push_back(name + ":" + std::to_string(t.dim())); });
  ForwardContext ctx;
  ctx.taps = &taps;
  autograd::NoGradGuard no_grad;
  model.forward(random_ids(1, 3, c.vocab_size), ctx);
  EXPECT_EQ(seen, (std::vector<std::string>{"model.norm:3", "logits:3"}));
  EXPECT_TRUE(taps.values().empty());
}

// CUDA: the same points as the CPU, values and gradients, in f32.
TEST(TapsCuda, ValuesAndGradientsEqualTheCpu) {
  MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0));
  const TransformerConfig c = config_of(/*qwen3_style=*/true);
  TransformerLM cpu_model(c, 10), cuda_model(c, 10);
  cuda_model.to(Device::cuda(0));
  const Tensor ids = random_ids(2, 9, c.vocab_size), targets = random_ids(2, 9, c.vocab_size);
  auto run = [&](const TransformerLM& model, Device device, Taps& taps) {
    ForwardContext ctx;
    ctx.taps = &taps;
    model.loss(ids.to(device), targets.to(device), ctx).backward();
  };
  Taps cpu_taps({"*", "*attn_weights"}), cuda_taps({"*", "*attn_weights"});
  cpu_taps.with_gradients();
  cuda_taps.with_gradients();
  run(cpu_model, Device::cpu(), cpu_taps);
  run(cuda_model, Device::cuda(0), cuda_taps);
  ASSERT_EQ(names_of(cuda_taps.values()), names_of(cpu_taps.values()));
  for (const TapRecord& r : cpu_taps.values()) {
    EXPECT_LE(testing::relative_error(host(*cuda_taps.value(r.name)), r.tensor), 1e-4) << r.name;
  }
  ASSERT_EQ(cuda_taps.gradients().size(), cpu_taps.gradients().size());
  for (const TapRecord& r : cpu_taps.gradients()) {
    ASSERT_NE(cuda_taps.gradient(r.name), nullptr) << r.name;
    EXPECT_LE(testing::relative_error(host(*cuda_taps.gradient(r.name)), r.tensor), 1e-4) << r.name;
  }
}

}  // namespace
}  // namespace microllm::nn
