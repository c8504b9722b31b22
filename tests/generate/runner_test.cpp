// The inference runner (generate/runner.h) against the training graph it runs the weights of
// (TransformerLM::forward): for every block its families describe (Llama-like, Qwen2's q/k/v biases, Qwen3's
// QK-norm and explicit head_dim, and the sandwich norms with GeGLU no shipped family uses yet), through each KV
// cache: a contiguous cache over a prompt and single-token steps, fill() leaving the same keys, the chosen-rows
// head, the paged cache's whole-prompt, chunked and decode forwards (generate/kv_cache.h), weights joined by
// fuse_projections or not, and a compute dtype other than the weights'. On CUDA: the decode GEMV's folded norms
// against the separate kernels.
#include "microllm/generate/runner.h"

#include <gtest/gtest.h>

#include <vector>

#include "microllm/autograd/variable.h"
#include "microllm/backend/backend.h"
#include "microllm/ops/indexing.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

enum class Block { llama, qwen2, qwen3, sandwich_geglu };
const Block kBlocks[] = {Block::llama, Block::qwen2, Block::qwen3, Block::sandwich_geglu};

const char* name_of(Block b) {
  switch (b) {
    case Block::llama: return "llama";
    case Block::qwen2: return "qwen2";
    case Block::qwen3: return "qwen3";
    case Block::sandwich_geglu: return "sandwich-geglu";
  }
  return "?";
}

nn::TransformerConfig config_of(Block b) {
  nn::TransformerConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.rope.theta = 1000;
  c.initializer_range = 0.3;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = b != Block::qwen3;
  c.attention_bias = b == Block::qwen2;
  c.qk_norm = b == Block::qwen3;
  if (b == Block::qwen3) c.head_dim = 6;  // explicit, unlike hidden / heads
  if (b == Block::sandwich_geglu) {
    c.norm_placement = nn::NormPlacement::sandwich;
    c.mlp_activation = nn::MlpActivation::gelu_tanh;
  }
  return c;
}

Tensor random_ids(int64_t batch, int64_t tokens, int64_t vocab) {
  return testing::random_tensor({batch, tokens}, DType::i64, Device::cpu(), 0, static_cast<double>(vocab));
}

Tensor training_forward(const nn::TransformerLM& model, const Tensor& ids) {
  autograd::NoGradGuard no_grad;
  return model.forward(ids, nn::ForwardContext()).value();
}

TEST(Runner, ContiguousCachePromptAndStepsEqualOneTrainingForward) {
  for (Block b : kBlocks) {
    SCOPED_TRACE(name_of(b));
    nn::TransformerLM model(config_of(b), testing::fresh_seed());
    const Tensor ids = random_ids(2, 9, 37);
    const Tensor expected = training_forward(model, ids);  // [2, 9, 37]
    const Runner runner(model, DType::f32);
    ContiguousKvCache cache(model.config(), 2, 16, DType::f32, Device::cpu());
    // A prompt of 5 tokens, then 4 single-token steps.
    std::vector<Tensor> pieces{runner.forward(ids.narrow(1, 0, 5).contiguous(), cache)};
    for (int64_t t = 5; t < 9; ++t) pieces.push_back(runner.forward(ids.narrow(1, t, 1).contiguous(), cache));
    EXPECT_EQ(cache.length(), 9);
    EXPECT_LE(testing::relative_error(concat(pieces, 1), expected), 1e-5);
  }
}

TEST(Runner, FillLeavesTheKeysForwardWouldAndLastRowsAreTheLastLogits) {
  for (Block b : kBlocks) {
    SCOPED_TRACE(name_of(b));
    nn::TransformerLM model(config_of(b), testing::fresh_seed());
    const Tensor ids = random_ids(2, 9, 37);
    const Tensor expected = training_forward(model, ids);
    const Runner runner(model, DType::f32);
    ContiguousKvCache cache(model.config(), 2, 16, DType::f32, Device::cpu());
    runner.fill(ids.narrow(1, 0, 6).contiguous(), cache);  // a prompt chunk whose logits nobody reads
    EXPECT_EQ(cache.length(), 6);
    const Tensor last = runner.forward(ids.narrow(1, 6, 3).contiguous(), cache, LogitRows::last());
    ASSERT_EQ(last.shape(), Shape({2, 1, 37}));
    EXPECT_LE(testing::relative_error(last, expected.narrow(1, 8, 1).contiguous()), 1e-5);
  }
}

TEST(Runner, ChosenRowsGiveTheLogitsOfThoseRowsOnly) {
  nn::TransformerLM model(config_of(Block::qwen2), testing::fresh_seed());
  const Runner runner(model, DType::f32);
  const Tensor ids = random_ids(2, 9, 37);
  const Tensor all = training_forward(model, ids);  // [2, 9, 37]
  ContiguousKvCache cache(model.config(), 2, 9, DType::f32, Device::cpu());
  const Tensor got =
      runner.forward(ids, cache, LogitRows::chosen(Tensor::from_vector(std::vector<int32_t>{3, 9 + 7}, {2})));
  ASSERT_EQ(got.shape(), Shape({2, 1, 37}));
  EXPECT_LE(testing::relative_error(got.select(0, 0), all.select(0, 0).narrow(0, 3, 1).contiguous()), 1e-5);
  EXPECT_LE(testing::relative_error(got.select(0, 1), all.select(0, 1).narrow(0, 7, 1).contiguous()), 1e-5);
  cache.reset();
  EXPECT_THROW(runner.forward(ids, cache, LogitRows::chosen(Tensor::from_vector(std::vector<int32_t>{0}, {1}))),
               ShapeError)
      << "one row per sequence";
}

// Joined projections (fuse_projections: one buffer, no copy) and the parts (concatenated by the runner) give the
// same logits; a runner in f64 over f32 weights converts them once.
TEST(Runner, JoinedOrSeparateWeightsAndAnotherComputeDtype) {
  for (Block b : kBlocks) {
    SCOPED_TRACE(name_of(b));
    nn::TransformerLM model(config_of(b), testing::fresh_seed());
    const Tensor ids = random_ids(1, 7, 37);
    const Tensor expected = training_forward(model, ids);
    auto run = [&](DType dtype) {
      ContiguousKvCache cache(model.config(), 1, 7, dtype, Device::cpu());
      return Runner(model, dtype).forward(ids, cache).to(DType::f32);
    };
    const Tensor separate = run(DType::f32), in_f64 = run(DType::f64);
    model.fuse_projections();
    const Tensor joined = run(DType::f32);
    EXPECT_LE(testing::relative_error(separate, expected), 1e-5);
    EXPECT_LE(testing::relative_error(joined, expected), 1e-5);
    EXPECT_LE(testing::relative_error(in_f64, expected), 1e-5);
  }
}

// The paged cache: two whole prompts padded in one forward (chosen rows), a longer prompt in two chunks (the
// second gathering the first's keys from its blocks), then decode steps of all three sequences at once; every
// logit equal to the contiguous runner's.
TEST(Runner, PagedPrefillChunksAndDecodeStepsEqualTheContiguousCache) {
  for (Block b : kBlocks) {
    SCOPED_TRACE(name_of(b));
    nn::TransformerLM model(config_of(b), testing::fresh_seed());
    const Runner runner(model, DType::f32);
    const int64_t block = 4, blocks_per_sequence = 8;
    PagedKvCache cache(model.config(), 3 * blocks_per_sequence, block, DType::f32, Device::cpu());
    // Sequence s owns blocks [s * 8, s * 8 + 8): its token at position p is slot s * 32 + p.
    std::vector<int32_t> tables;
    for (int32_t s = 0; s < 3; ++s) {
      for (int32_t j = 0; j < blocks_per_sequence; ++j) tables.push_back(s * blocks_per_sequence + j);
    }
    const Tensor block_tables = Tensor::from_vector(tables, {3, blocks_per_sequence});
    auto slot = [&](int64_t s, int64_t p) { return static_cast<int32_t>(s * blocks_per_sequence * block + p); };
    const std::vector<int64_t> lengths = {5, 3, 11};
    std::vector<Tensor> prompts;
    for (int64_t n : lengths) prompts.push_back(random_ids(1, n, 37));
    auto reference = [&](int64_t s, const std::vector<int64_t>& next) {  // the contiguous runner's last logits
      ContiguousKvCache contiguous(model.config(), 1, 32, DType::f32, Device::cpu());
      Tensor logits = runner.forward(prompts[static_cast<size_t>(s)], contiguous, LogitRows::last());
      for (int64_t id : next) {
        logits = runner.forward(Tensor::from_vector(std::vector<int64_t>{id}, {1, 1}), contiguous);
      }
      return logits.reshape({37});
    };
    // Sequences 0 and 1 as whole prompts, two rows padded to 5 (padding: slot -1, the last position again).
    std::vector<int64_t> ids(10, 0);
    std::vector<int32_t> slots(10, -1), positions(10, 0);
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t t = 0; t < 5; ++t) {
        const auto at = static_cast<size_t>(s * 5 + t);
        positions[at] = static_cast<int32_t>(std::min(t, lengths[static_cast<size_t>(s)] - 1));
        if (t >= lengths[static_cast<size_t>(s)]) continue;
        ids[at] = prompts[static_cast<size_t>(s)].to_vector<int64_t>()[static_cast<size_t>(t)];
        slots[at] = slot(s, t);
      }
    }
    PagedPrefill whole(cache, {.slots = Tensor::from_vector(slots, {10}),
                               .positions = Tensor::from_vector(positions, {2, 5}),
                               .block_tables = block_tables});
    const Tensor first = runner.forward(Tensor::from_vector(ids, {2, 5}), whole,
                                        LogitRows::chosen(Tensor::from_vector(std::vector<int32_t>{4, 5 + 2}, {2})));
    EXPECT_LE(testing::relative_error(first.select(0, 0).reshape({37}), reference(0, {})), 1e-5);
    EXPECT_LE(testing::relative_error(first.select(0, 1).reshape({37}), reference(1, {})), 1e-5);
    // Sequence 2 in chunks of 6 and 5.
    auto chunk = [&](int64_t start, int64_t count) {
      std::vector<int32_t> chunk_slots, chunk_positions;
      for (int64_t p = start; p < start + count; ++p) {
        chunk_slots.push_back(slot(2, p));
        chunk_positions.push_back(static_cast<int32_t>(p));
      }
      return PagedPrefill(cache, {.slots = Tensor::from_vector(chunk_slots, {count}),
                                  .positions = Tensor::from_vector(chunk_positions, {1, count}),
                                  .block_tables = block_tables,
                                  .chunk_start = start,
                                  .chunk_row = 2});
    };
    PagedPrefill head = chunk(0, 6), tail = chunk(6, 5);
    runner.fill(prompts[2].narrow(1, 0, 6).contiguous(), head);
    const Tensor third = runner.forward(prompts[2].narrow(1, 6, 5).contiguous(), tail, LogitRows::last());
    EXPECT_LE(testing::relative_error(third.reshape({37}), reference(2, {})), 1e-5);
    // Two decode steps of the three sequences together.
    std::vector<std::vector<int64_t>> fed(3);
    for (int step = 0; step < 2; ++step) {
      std::vector<int64_t> step_ids;
      std::vector<int32_t> step_slots, step_positions;
      for (int64_t s = 0; s < 3; ++s) {
        const int64_t position = lengths[static_cast<size_t>(s)] + step;
        step_ids.push_back(random_ids(1, 1, 37).to_vector<int64_t>()[0]);
        fed[static_cast<size_t>(s)].push_back(step_ids.back());
        step_slots.push_back(slot(s, position));
        step_positions.push_back(static_cast<int32_t>(position));
      }
      PagedDecode decode(cache, {.slots = Tensor::from_vector(step_slots, {3}),
                                 .block_tables = block_tables,
                                 .seq_ids = Tensor::from_vector(std::vector<int32_t>{0, 1, 2}, {3}),
                                 .positions = Tensor::from_vector(step_positions, {3}),
                                 .max_context = 16});
      const Tensor logits = runner.forward(Tensor::from_vector(step_ids, {3, 1}), decode);  // [3, 1, 37]
      for (int64_t s = 0; s < 3; ++s) {
        EXPECT_LE(testing::relative_error(logits.select(0, s).reshape({37}), reference(s, fed[static_cast<size_t>(s)])),
                  1e-5)
            << "step " << step << ", sequence " << s;
      }
    }
  }
}

// A bf16 model's decode steps on CUDA, where the RMSNorms and SwiGLU fold into the decode GEMV (ops/norm_linear.h,
// src/backend/cuda/gemv.cu: one or two rows), against the same steps with the GEMV off (the separate rms_norm,
// cuBLASLt and swiglu kernels): the logits agree within bf16's rounding, for each block, batch 1 and 2, several
// steps (so the residual stream the fold writes feeds the next layer and step).
TEST(RunnerCuda, DecodeFoldedIntoTheGemvEqualsTheSeparateKernels) {
  const Device gpu = Device::cuda(0);
  MICROLLM_SKIP_IF_UNAVAILABLE(gpu);
  for (Block b : kBlocks) {
    for (int64_t batch : {1, 2}) {
      SCOPED_TRACE(str_cat(name_of(b), " batch ", batch));
      nn::TransformerConfig config = config_of(b);
      config.hidden_size = 64, config.intermediate_size = 136, config.head_dim = 32;
      nn::TransformerLM model(config, testing::fresh_seed());
      model.to(gpu);
      model.to(DType::bf16);
      model.fuse_projections();
      const Tensor prompt = random_ids(batch, 5, 37).to(gpu);
      std::vector<Tensor> next;
      for (int i = 0; i < 3; ++i) next.push_back(random_ids(batch, 1, 37).to(gpu));
      auto decode = [&](bool gemv) {
        const testing::ScopedSwitch setting(decode_gemv, set_decode_gemv, gemv);
        const Runner runner(model, DType::bf16);
        ContiguousKvCache cache(model.config(), batch, 16, DType::bf16, gpu);
        runner.fill(prompt, cache);
        std::vector<Tensor> logits;
        for (const Tensor& ids : next) logits.push_back(runner.forward(ids, cache).select(1, 0).to(Device::cpu()));
        return logits;
      };
      const std::vector<Tensor> folded = decode(true), separate = decode(false);
      for (size_t step = 0; step < next.size(); ++step) {
        // Two bf16 computations that sum in different orders: a few 1e-3 apart; a wrong row or a lost residual
        // stream moves the logits by O(1).
        EXPECT_LE(testing::relative_error(folded[step], separate[step]), 5e-2) << "decode step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace microllm::generate
