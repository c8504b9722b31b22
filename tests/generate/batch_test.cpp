// generate_batch: prompts of different lengths prefilled and decoded together (left padding, a padding
// mask, per-sequence positions) give, greedily, exactly the tokens of each prompt alone; stop ids,
// max_new_tokens, the context window and callbacks finish sequences independently; sampling seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "generate_test_model.h"
#include "microllm/generate/generate.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

using testing_model::random_prompt;
using testing_model::exact_dtype;
using testing_model::tiny_config;

// The model on `device` in the dtype of exact comparisons there (f64 on the CPU: see exact_dtype).
struct Fixture {
  uint64_t seed = testing::fresh_seed();
  nn::TransformerConfig config;
  std::unique_ptr<nn::TransformerLM> model;
  Generator gen{seed + 1};
  explicit Fixture(int64_t max_positions = 64, Device device = Device::cpu())
      : config(tiny_config(max_positions)), model(std::make_unique<nn::TransformerLM>(config, seed)) {
    model->to(device);
    model->to(exact_dtype(device));
  }
  std::vector<std::vector<int32_t>> prompts(const std::vector<size_t>& lengths) {
    std::vector<std::vector<int32_t>> out;
    for (size_t n : lengths) out.push_back(random_prompt(gen, n, config.vocab_size));
    return out;
  }
};

GenerateOptions greedy(int64_t max_new_tokens, DType dtype = exact_dtype(Device::cpu())) {
  GenerateOptions o;
  o.compute_dtype = dtype;
  o.max_new_tokens = max_new_tokens;
  o.sampling.temperature = 0;
  return o;
}

TEST(GenerateBatch, GreedyEqualsEachPromptAlone) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  for (const std::vector<size_t>& lengths : {std::vector<size_t>{5, 1, 12, 7, 12}, std::vector<size_t>{6, 6, 6}}) {
    const auto prompts = f.prompts(lengths);
    const GenerateOptions options = greedy(12);
    const std::vector<Generation> batch = generate_batch(*f.model, prompts, options);
    ASSERT_EQ(batch.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(batch[i].tokens, generate(*f.model, prompts[i], options)) << "sequence " << i;
      EXPECT_EQ(batch[i].tokens.size(), 12u);
      EXPECT_EQ(batch[i].finish_reason, FinishReason::length);
    }
  }
}

TEST(GenerateBatch, StopIdsFinishSequencesIndependently) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const auto prompts = f.prompts({3, 9, 1, 5});
  GenerateOptions options = greedy(16);
  const std::vector<int32_t> first = generate(*f.model, prompts[0], options);
  ASSERT_EQ(first.size(), 16u);
  options.stop_ids = {first[3]};  // sequence 0 ends at its 4th token (or earlier, if it came before)
  const std::vector<Generation> batch = generate_batch(*f.model, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> alone = generate(*f.model, prompts[i], options);
    EXPECT_EQ(batch[i].tokens, alone) << "sequence " << i;
    const bool ended_by_eos = !alone.empty() && alone.back() == first[3];
    EXPECT_EQ(batch[i].finish_reason, ended_by_eos ? FinishReason::eos : FinishReason::length) << i;
    // Nothing after the first stop id.
    const auto stop = std::find(batch[i].tokens.begin(), batch[i].tokens.end(), first[3]);
    if (stop != batch[i].tokens.end()) {
      EXPECT_EQ(stop + 1, batch[i].tokens.end()) << i;
    }
  }
  EXPECT_EQ(batch[0].finish_reason, FinishReason::eos);
  EXPECT_LE(batch[0].tokens.size(), 4u);
}

TEST(GenerateBatch, TheContextWindowEndsEachSequenceAsAlone) {
  Fixture f(/*max_positions=*/16);
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const auto prompts = f.prompts({3, 10, 15, 12});
  const GenerateOptions options = greedy(8);
  const std::vector<Generation> batch = generate_batch(*f.model, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> alone = generate(*f.model, prompts[i], options);
    EXPECT_EQ(batch[i].tokens, alone) << "sequence " << i;
    // Positions 0..15 can be fed: a prompt of P tokens gets at most 16 - P + 1 new ones.
    const size_t room = 16 - prompts[i].size() + 1;
    EXPECT_EQ(batch[i].tokens.size(), std::min<size_t>(8, room)) << i;
    EXPECT_EQ(batch[i].finish_reason, room < 8 ? FinishReason::context : FinishReason::length) << i;
  }
}

TEST(GenerateBatch, SequenceISamplesWithSeedPlusI) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const std::vector<int32_t> prompt = f.prompts({4})[0];
  GenerateOptions options;
  options.compute_dtype = exact_dtype(Device::cpu());
  options.max_new_tokens = 20;
  options.sampling.temperature = 1.5;  // near-uniform over 61 tokens: different seeds give different text
  options.sampling.seed = f.seed % 1000;
  const std::vector<Generation> batch = generate_batch(*f.model, {prompt, prompt, prompt}, options);
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < batch.size(); ++i) {
    GenerateOptions alone = options;
    alone.sampling.seed = options.sampling.seed + i;
    EXPECT_EQ(batch[i].tokens, generate(*f.model, prompt, alone)) << "sequence " << i;
    distinct.insert(batch[i].tokens);
  }
  EXPECT_EQ(distinct.size(), 3u);
  // The same seed again: the same samples.
  const std::vector<Generation> again = generate_batch(*f.model, {prompt, prompt, prompt}, options);
  for (size_t i = 0; i < batch.size(); ++i) EXPECT_EQ(again[i].tokens, batch[i].tokens);
}

TEST(GenerateBatch, CallbackStreamsEachSequenceAndCanStopOne) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const auto prompts = f.prompts({2, 6});
  const GenerateOptions options = greedy(10);
  std::vector<std::vector<int32_t>> streamed(2);
  const std::vector<Generation> batch = generate_batch(*f.model, prompts, options, [&](size_t i, int32_t token) {
    streamed[i].push_back(token);
    return !(i == 1 && streamed[i].size() == 3);  // sequence 1 stops after 3 tokens
  });
  EXPECT_EQ(streamed[0], batch[0].tokens);
  EXPECT_EQ(streamed[1], batch[1].tokens);
  EXPECT_EQ(batch[0].tokens.size(), 10u);
  EXPECT_EQ(batch[1].tokens.size(), 3u);
  EXPECT_EQ(batch[1].finish_reason, FinishReason::callback);
  const std::vector<int32_t> alone = generate(*f.model, prompts[1], options);
  EXPECT_EQ(batch[1].tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 3));
}

// The same on the GPU (f32): the masked batch goes through other attention kernels than a single sequence.
TEST(GenerateBatchCuda, GreedyEqualsEachPromptAlone) {
  MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0));
  Fixture f(64, Device::cuda(0));
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const auto prompts = f.prompts({5, 1, 12, 7});
  const GenerateOptions options = greedy(12, exact_dtype(Device::cuda(0)));
  const std::vector<Generation> batch = generate_batch(*f.model, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batch[i].tokens, generate(*f.model, prompts[i], options)) << "sequence " << i;
  }
}

TEST(GenerateBatch, EdgeCasesAndErrors) {
  Fixture f;
  EXPECT_TRUE(generate_batch(*f.model, {}, greedy(4)).empty());
  const auto prompts = f.prompts({3, 4});
  for (const Generation& g : generate_batch(*f.model, prompts, greedy(0))) EXPECT_TRUE(g.tokens.empty());
  EXPECT_THROW(generate_batch(*f.model, {{1, 2}, {}}, greedy(4)), ValueError);
  EXPECT_THROW(generate_batch(*f.model, {{1, 2, 61}}, greedy(4)), ValueError);  // outside the vocabulary
  GenerateOptions with_text = greedy(4);
  with_text.stop_strings = {"x"};
  EXPECT_THROW(generate_batch(*f.model, prompts, with_text), ValueError);
}

}  // namespace
}  // namespace microllm::generate
