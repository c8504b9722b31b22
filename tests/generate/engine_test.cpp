// The serving engine (continuous batching over a paged KV cache): every request gets what generate() gives
// it alone, however requests are batched, chunked, admitted late or bounded by KV blocks; cancellation and
// finishing give rows and blocks back; requests that can never fit are refused with a clear error. The same
// bodies run on the CPU and, where there is a GPU, on CUDA with the decode step replayed from CUDA graphs.
#include "microllm/generate/engine.h"

#include <gtest/gtest.h>

#include <map>

#include "generate_test_model.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

using testing_model::random_prompt;
using testing_model::tiny_config;

class EngineTest : public testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    config_ = tiny_config(96);
    model_ = std::make_unique<nn::TransformerLM>(config_, seed_);
    model_->to(GetParam());
    model_->to(dtype_);
  }

  // Options in the test's dtype; every engine of a test is built through here.
  EngineOptions engine_options(EngineOptions o = {}) const {
    o.dtype = dtype_;
    return o;
  }

  std::vector<int32_t> prompt(size_t length) { return random_prompt(gen_, length, config_.vocab_size); }

  // What generate() gives `r` alone.
  std::vector<int32_t> alone(const EngineRequest& r) {
    GenerateOptions o;
    o.compute_dtype = dtype_;
    o.max_new_tokens = r.max_new_tokens;
    o.sampling = r.sampling;
    o.stop_ids = r.stop_ids;
    return generate(*model_, r.prompt, o);
  }

  static EngineRequest request(std::vector<int32_t> prompt, int64_t max_new_tokens, SamplingParams sampling = greedy()) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new_tokens;
    r.sampling = sampling;
    return r;
  }
  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }
  static SamplingParams top_k(double temperature, int64_t k, uint64_t seed) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = k;
    p.seed = seed;
    return p;
  }

  // Submits every request (tracking results by id) and runs the engine until idle.
  std::map<uint64_t, Generation> run(Engine& engine, const std::vector<EngineRequest>& requests) {
    std::map<uint64_t, Generation> results;
    for (EngineRequest r : requests) {
      auto* slot = &results;
      auto id = std::make_shared<uint64_t>(0);
      r.on_finish = [slot, id](const Generation& g) { (*slot)[*id] = g; };
      *id = engine.submit(std::move(r));
    }
    engine.run_until_idle();
    return results;
  }

  // Every request got what generate() gives it alone (results ordered by id: submission order).
  void expect_each_as_alone(const std::map<uint64_t, Generation>& results, const std::vector<EngineRequest>& requests) {
    ASSERT_EQ(results.size(), requests.size());
    size_t i = 0;
    for (const auto& [id, g] : results) {
      EXPECT_EQ(g.tokens, alone(requests[i])) << "request " << i;
      ++i;
    }
  }

  // f64 on the CPU, where the batched and the lone runs take different BLAS kernels (see exact_dtype); f32 on
  // CUDA.
  DType dtype_ = testing_model::exact_dtype(GetParam());
  uint64_t seed_ = testing::fresh_seed();
  Generator gen_{seed_ + 7};
  nn::TransformerConfig config_;
  std::unique_ptr<nn::TransformerLM> model_;
};

TEST_P(EngineTest, BatchedGreedyEqualsEachRequestAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<EngineRequest> requests;
  for (size_t length : {5, 1, 23, 9, 40, 3}) requests.push_back(request(prompt(length), 14));
  EngineOptions options = engine_options();
  options.max_batch = 4;      // six requests: two wait for a row
  options.block_size = 4;
  options.prefill_chunk = 7;  // prompts of 9, 23 and 40 tokens are prefilled in several chunks
  Engine engine(*model_, options);
  const auto results = run(engine, requests);
  expect_each_as_alone(results, requests);
  for (const auto& [id, g] : results) EXPECT_EQ(g.finish_reason, FinishReason::length);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv_blocks_used, 0) << "finished requests give their blocks back";
  EXPECT_EQ(stats.decoding + stats.prefilling + stats.waiting, 0);
  EXPECT_EQ(stats.generated_tokens, 6u * 14u);
  EXPECT_EQ(stats.prefill_samples, 5u) << "each prompt of 2+ tokens gets its first token from its prefill";
  EXPECT_EQ(stats.decoded_sequences + stats.prefill_samples, stats.generated_tokens)
      << "every other token comes from a decode step";
  EXPECT_EQ(stats.discarded_rows, 0u) << "a request that ends by length is never fed past its budget";
  EXPECT_LT(stats.decode_steps, stats.decoded_sequences) << "decode steps batch several sequences";
  EXPECT_LT(stats.input_uploads, stats.decode_steps) << "steps whose batch did not change upload nothing";
  EXPECT_EQ(stats.prompt_tokens, 5u + 1 + 23 + 9 + 40 + 3);
  if (GetParam().is_cuda()) {
    EXPECT_GT(stats.graph_replays, 0u);
    EXPECT_GT(stats.graphs_captured, 0u);
    // Replayed from graphs: the full chunks before a prompt's last (23 tokens at 0, 7 and 14, 9 at 0, 40 at
    // 0 .. 28) and the prompts that fit one chunk (5 and 3 tokens, padded to 7); the last chunks of the longer
    // prompts run eagerly.
    EXPECT_EQ(stats.prefill_graph_replays, 3u + 1 + 5 + 2);
  }
}

TEST_P(EngineTest, WholePromptsThatFitOneChunkArePrefilledTogether) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // A chunk of 64 tokens. The prompts of 5, 12, 9 and 3 tokens share one forward (4 rows of 16); the 30-token
  // prompt (rows of 32) does not fit with them and goes alone next; the 70-token one is longer than a chunk and
  // prefills in two; the one-token prompt needs no prefill. The 12-token request samples: its row of the shared
  // forward keeps its own parameters and seed.
  std::vector<EngineRequest> requests;
  for (size_t length : {5, 12, 9, 30, 1, 3, 70}) requests.push_back(request(prompt(length), 6));
  requests[1].sampling = top_k(0.8, 20, seed_);
  EngineOptions options = engine_options();
  options.max_batch = 8;
  options.block_size = 4;
  options.prefill_chunk = 64;
  Engine engine(*model_, options);
  expect_each_as_alone(run(engine, requests), requests);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.prefill_samples, 6u);
  EXPECT_EQ(stats.prefill_forwards, 4u) << "5 + 12 + 9 + 3, then 30, then 70 in two chunks";
  if (GetParam().is_cuda()) {
    EXPECT_EQ(stats.prefill_graph_replays, 3u) << "the shared forward, the 30-token prompt, the first chunk of 70";
  }
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

TEST_P(EngineTest, SampledRequestsEqualGenerateWithTheirSeeds) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 5; ++i) {
    SamplingParams p;
    p.temperature = 0.8 + 0.1 * i;
    p.top_k = i == 1 ? 10 : 0;
    p.top_p = i == 2 ? 0.9 : 1.0;
    p.min_p = i == 3 ? 0.05 : 0.0;
    p.repetition_penalty = i == 4 ? 1.3 : 1.0;
    p.frequency_penalty = i == 4 ? 0.2 : 0.0;
    p.seed = seed_ + static_cast<uint64_t>(i);
    requests.push_back(request(prompt(3 + 4 * static_cast<size_t>(i)), 12, p));
  }
  EngineOptions options = engine_options();
  options.max_batch = 8;
  options.block_size = 8;
  Engine engine(*model_, options);
  expect_each_as_alone(run(engine, requests), requests);
}

// Steps whose decoding rows are all greedy sample with SamplerRows::greedy_only (their own CUDA graphs); the
// rest take the general path. Two rows for four requests: sampled and greedy sequences share steps, take each
// other's rows, greedy ones decode while a sampled one still prefills and after one finished below them. A row
// holding a sampled request's params in an all-greedy step would throw (the CPU kernel checks the promise, the CUDA one reports it).
TEST_P(EngineTest, MixedGreedyAndSampledRequestsEqualEachRequestAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const SamplingParams sampled = top_k(0.9, 20, seed_);
  SamplingParams penalized_greedy = greedy();
  penalized_greedy.repetition_penalty = 1.4;
  penalized_greedy.frequency_penalty = 0.3;
  // Request 3 ends well before request 2: its row then idles below a greedy one, still in the sampled range.
  const std::vector<EngineRequest> requests{request(prompt(3), 16), request(prompt(20), 5, sampled),
                                            request(prompt(2), 24, penalized_greedy), request(prompt(9), 2, sampled)};
  EngineOptions options = engine_options();
  options.max_batch = 2;
  options.block_size = 4;
  options.prefill_chunk = 4;  // the 20-token prompt prefills over several steps while request 0 decodes
  Engine engine(*model_, options);
  expect_each_as_alone(run(engine, requests), requests);
  const EngineStats stats = engine.stats();
  EXPECT_GT(stats.greedy_decode_steps, 0u) << "no step took the greedy-only path";
  EXPECT_LT(stats.greedy_decode_steps, stats.decode_steps) << "no step took the general path";
}

TEST_P(EngineTest, LateArrivalsJoinRunningDecodesWithoutChangingThem) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  EngineOptions options = engine_options();
  options.max_batch = 3;
  options.block_size = 4;
  options.prefill_chunk = 5;
  Engine engine(*model_, options);
  std::vector<EngineRequest> requests{request(prompt(6), 20), request(prompt(17), 9), request(prompt(2), 15),
                                      request(prompt(30), 6)};
  std::vector<Generation> results(requests.size());
  std::vector<std::vector<int32_t>> streamed(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest r = requests[i];
    r.on_token = [&streamed, i](int32_t t) {
      streamed[i].push_back(t);
      return true;
    };
    r.on_finish = [&results, i](const Generation& g) { results[i] = g; };
    engine.submit(std::move(r));
    for (int s = 0; s < 3; ++s) engine.step();  // the earlier ones are mid-decode when the next arrives
  }
  engine.run_until_idle();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(results[i].tokens, alone(requests[i])) << "request " << i;
    EXPECT_EQ(streamed[i], results[i].tokens) << "request " << i << ": on_token saw every token once, in order";
  }
}

TEST_P(EngineTest, StopIdsCancellationAndCallbacksEndRequestsAndFreeTheirBlocks) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Engine engine(*model_, engine_options({.max_batch = 4, .block_size = 4}));
  // A stop id: the first token this request would produce greedily after two tokens.
  EngineRequest stop = request(prompt(7), 30);
  const std::vector<int32_t> free_run = alone(stop);
  stop.stop_ids = {free_run[2]};
  const auto first_stop = std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin();
  Generation stopped, cancelled, refused_by_callback;
  stop.on_finish = [&](const Generation& g) { stopped = g; };
  engine.submit(stop);
  EngineRequest cancel_me = request(prompt(5), 30);
  cancel_me.on_finish = [&](const Generation& g) { cancelled = g; };
  const uint64_t cancel_id = engine.submit(cancel_me);
  EngineRequest callback = request(prompt(4), 30);
  int seen = 0;
  callback.on_token = [&](int32_t) { return ++seen < 3; };
  callback.on_finish = [&](const Generation& g) { refused_by_callback = g; };
  engine.submit(callback);
  for (int s = 0; s < 4; ++s) engine.step();
  engine.cancel(cancel_id);
  engine.run_until_idle();
  EXPECT_EQ(stopped.finish_reason, FinishReason::eos);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first_stop + 1));
  EXPECT_EQ(cancelled.finish_reason, FinishReason::callback);
  EXPECT_LT(cancelled.tokens.size(), 30u);
  EXPECT_EQ(refused_by_callback.finish_reason, FinishReason::callback);
  EXPECT_EQ(refused_by_callback.tokens.size(), 3u);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  // The stop id shows when its step is read, after the next step was enqueued: that step fed it once more.
  EXPECT_GE(engine.stats().discarded_rows, 1u);
  engine.cancel(cancel_id);  // already finished: ignored
  EXPECT_FALSE(engine.step());
}

TEST_P(EngineTest, TheFirstTokenComesFromThePrefillAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // A budget of one token: the prefill samples it and no decode step runs. A first token that is a stop id
  // ends the request at once; its first decode step, enqueued before the prefill's token was read, is
  // discarded. A one-token prompt still gets its first token from a decode step.
  EngineRequest one = request(prompt(12), 1);
  EngineRequest stops = request(prompt(9), 10);
  stops.stop_ids = {alone(stops)[0]};
  const EngineRequest single = request(prompt(1), 3);
  EngineOptions options = engine_options();
  options.max_batch = 4;
  options.block_size = 4;
  options.prefill_chunk = 5;  // 12 and 9 tokens: the first token comes from a third and a second chunk
  {
    Engine engine(*model_, options);
    const auto results = run(engine, {one});
    expect_each_as_alone(results, {one});
    EXPECT_EQ(results.begin()->second.finish_reason, FinishReason::length);
    EXPECT_EQ(engine.stats().decode_steps, 0u) << "a one-token budget needs no decode step";
    EXPECT_EQ(engine.stats().prefill_samples, 1u);
  }
  Engine engine(*model_, options);
  const auto results = run(engine, {stops, single});
  expect_each_as_alone(results, {stops, single});
  EXPECT_EQ(results.begin()->second.tokens.size(), 1u);
  EXPECT_EQ(results.begin()->second.finish_reason, FinishReason::eos);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.prefill_samples, 1u) << "the one-token prompt has no prefill";
  EXPECT_EQ(stats.discarded_rows, 1u) << "the stopped request's first decode step";
  EXPECT_EQ(stats.generated_tokens, 1u + 3u);
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

TEST_P(EngineTest, DecodeStepsOfAnUnchangedBatchUploadNothing) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Each step moves its positions and slots on by itself (across 4-token blocks here) and hands its ids to the
  // host: the host uploads a step's inputs when a row starts or stops decoding, not otherwise.
  const std::vector<EngineRequest> one{request(prompt(10), 21)};
  {
    Engine engine(*model_, engine_options({.max_batch = 4, .block_size = 4}));
    expect_each_as_alone(run(engine, one), one);
    EXPECT_EQ(engine.stats().decode_steps, 20u);
    EXPECT_EQ(engine.stats().input_uploads, 1u) << "only the first step's";
  }
  // The second joins the first's decoding two steps in (a row starts: upload), the first ends (its row stops
  // being fed: upload); the rest need none.
  const std::vector<EngineRequest> two{request(prompt(10), 21), request(prompt(6), 9)};
  Engine engine(*model_, engine_options({.max_batch = 4, .block_size = 4, .prefill_chunk = 5}));
  expect_each_as_alone(run(engine, two), two);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.decoded_sequences, 20u + 8u);
  EXPECT_LE(stats.input_uploads, 3u) << stats.decode_steps << " decode steps";
  EXPECT_GE(stats.input_uploads, 2u);
}

TEST_P(EngineTest, TinyChunksCaptureABoundedNumberOfGraphs) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<EngineRequest> requests{request(prompt(80), 3)};
  EngineOptions options = engine_options();
  options.block_size = 4;
  options.prefill_chunk = 1;  // 79 full chunks before the last: 64 from graphs (one per start), 15 eagerly
  Engine engine(*model_, options);
  expect_each_as_alone(run(engine, requests), requests);
  if (GetParam().is_cuda()) {
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.prefill_graph_replays, 64u);
    EXPECT_LE(stats.graphs_captured, 64u + 2) << "the chunk graphs and the decode steps' (one context bucket)";
  }
}

TEST_P(EngineTest, ARowAndBlocksFreedOneStepLateGoToTheNextRequestUnchanged) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Two rows and a pool of exactly the first two requests' blocks (7 + 11): the third waits for the first's.
  // The first ends on a stop id, which shows only when its step is read, after the next step has fed it once
  // more (into a slot of its blocks); its row and blocks then go to the third while that step is still in
  // flight (the second keeps decoding), so the step's row must be discarded, not given to the third.
  EngineRequest first = request(prompt(5), 20);
  first.stop_ids = {alone(first)[3]};
  const std::vector<EngineRequest> requests{first, request(prompt(3), 40), request(prompt(6), 12)};
  Engine engine(*model_, engine_options({.max_batch = 2, .block_size = 4, .kv_blocks = 18}));
  expect_each_as_alone(run(engine, requests), requests);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.discarded_rows, 1u) << "the first request was fed once past its stop id";
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

TEST_P(EngineTest, AdmissionIsBoundedByFreeBlocksAndImpossibleRequestsAreRefused) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  EngineOptions options = engine_options();
  options.max_batch = 8;
  options.block_size = 4;
  options.kv_blocks = 10;  // 40 tokens: one request of 20 + 12 at a time
  Engine engine(*model_, options);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(request(prompt(20), 12));
  int64_t most_blocks = 0;
  for (EngineRequest& r : requests) r.on_token = [&](int32_t) {
    most_blocks = std::max(most_blocks, engine.stats().kv_blocks_used);
    return true;
  };
  const auto results = run(engine, requests);
  EXPECT_EQ(most_blocks, 8) << "only one request's 8 blocks fit at a time";
  expect_each_as_alone(results, requests);

  try {
    engine.submit(request(prompt(30), 20));  // 50 tokens: 13 blocks of the 10
    FAIL() << "a request larger than the whole cache was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("KV blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.submit(request({}, 4)), ValueError);
  EXPECT_THROW(engine.submit(request(prompt(96), 4)), ValueError);  // fills the window
  EXPECT_THROW(engine.submit(request({static_cast<int32_t>(config_.vocab_size)}, 4)), ValueError);
  EXPECT_TRUE(engine.idle());
}

TEST_P(EngineTest, ASequenceStopsAtTheWindow) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Engine engine(*model_, engine_options({.max_batch = 2, .block_size = 8}));
  EngineRequest r = request(prompt(90), 50);  // the window is 96: 7 tokens fit (the last one is not fed back)
  const auto results = run(engine, {r});
  ASSERT_EQ(results.size(), 1u);
  const Generation& g = results.begin()->second;
  EXPECT_EQ(g.finish_reason, FinishReason::context);
  EXPECT_EQ(g.tokens, alone(r));
  EXPECT_EQ(g.tokens.size(), 7u);
}

INSTANTIATE_TEST_SUITE_P(Devices, EngineTest, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         [](const auto& param_info) { return param_info.param.is_cuda() ? std::string("cuda") : "cpu"; });

}  // namespace
}  // namespace microllm::generate
