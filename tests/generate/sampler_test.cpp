// Samplers: greedy, seeded determinism, top-k / top-p / min-p truncation, repetition penalty, and the
// decode loop with the KV cache giving the same tokens as full forwards.
#include "microllm/generate/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "microllm/autograd/variable.h"
#include "microllm/generate/generate.h"
#include "microllm/nn/transformer.h"

namespace microllm::generate {
namespace {

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s({.temperature = 0});
  const std::vector<float> logits{0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, SameSeedSameTokensAndFrequenciesFollowTheSoftmax) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 0.2 0.3 0.4
  Sampler a({.seed = 7}), b({.seed = 7});
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = a.sample(logits, {});
    EXPECT_EQ(t, b.sample(logits, {}));
    ++counts[t];
  }
  for (int32_t t = 0; t < 4; ++t) EXPECT_NEAR(counts[t] / double(n), 0.1 * (t + 1), 0.015) << t;
}

TEST(Sampler, TopKTopPAndMinPTruncate) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Sampler top_k({.top_k = 2, .seed = seed});
    EXPECT_GE(top_k.sample(logits, {}), 2);
    Sampler top_p({.top_p = 0.65, .seed = seed});  // 0.4 + 0.3 reaches 0.65
    EXPECT_GE(top_p.sample(logits, {}), 2);
    Sampler min_p({.min_p = 0.6, .seed = seed});  // keeps p >= 0.24: ids 2 and 3
    EXPECT_GE(min_p.sample(logits, {}), 2);
  }
  EXPECT_THROW(Sampler({.top_p = 0}), ValueError);
  EXPECT_THROW(Sampler({.temperature = -1}), ValueError);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  Sampler s({.temperature = 0, .repetition_penalty = 2.0});
  const std::vector<float> logits{1.0f, 1.5f, -3.0f};
  const std::vector<int32_t> history{1};
  EXPECT_EQ(s.sample(logits, history), 0);  // 1.5 / 2 < 1.0
  Sampler presence({.temperature = 0, .presence_penalty = 0.6});
  EXPECT_EQ(presence.sample(logits, history), 0);  // 1.5 - 0.6 < 1.0
  Sampler frequency({.temperature = 0, .frequency_penalty = 0.3});
  const std::vector<int32_t> once{1}, twice{1, 1};
  EXPECT_EQ(frequency.sample(logits, once), 1);   // 1.5 - 0.3 > 1.0
  EXPECT_EQ(frequency.sample(logits, twice), 0);  // 1.5 - 0.6 < 1.0
}

TEST(Generate, CachedDecodingMatchesFullForwards) {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny", 256);
  c.num_layers = 2;
  nn::TransformerLM model(c, 3);
  const std::vector<int32_t> prompt{72, 101, 108, 108, 111};
  GenerateOptions options;
  options.max_new_tokens = 6;
  options.sampling.temperature = 0;
  std::vector<int32_t> streamed;
  const std::vector<int32_t> out = generate(model, prompt, options, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out, streamed);
  // Greedy from full forwards over the growing sequence.
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  for (int32_t expected : out) {
    const Tensor logits = model.forward(Tensor::from_vector(seq, {1, static_cast<int64_t>(seq.size())}), {}).value();
    const std::vector<float> last = logits.select(1, logits.size(1) - 1).reshape({-1}).to_vector<float>();
    const auto argmax = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    EXPECT_EQ(argmax, expected);
    seq.push_back(expected);
  }
  // A callback returning false stops.
  EXPECT_EQ(generate(model, prompt, options, [](int32_t) { return false; }).size(), 1u);
}

}  // namespace
}  // namespace microllm::generate
