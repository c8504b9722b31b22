// sample_tokens: the CPU kernel against generate::Sampler row by row (one reference: sampling_math.h), the
// state it advances, strided and narrowed views, a chi-square check of the draws against the softmax, the
// truncations never returning an excluded id, CUDA against the CPU (identical ids, no host transfer), and
// the argument checks; SamplerRows::greedy_only (the promise checked on both devices, penalties still applied)
// and argmax ties across the CUDA kernels' vocabulary chunks.
#include "microllm/ops/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "microllm/backend/sampling_math.h"
#include "microllm/core/cuda.h"
#include "microllm/core/random.h"
#include "microllm/generate/sampler.h"
#include "microllm/ops/elementwise.h"
#include "test_support.h"

namespace microllm {
namespace {

using generate::Sampler;
using generate::SamplingParams;

// A mix of every kind of row: greedy, plain temperature, top-k, top-p, min-p, penalties, and combinations.
SamplingParams row_kind(int64_t b, int64_t vocab, Generator& gen) {
  SamplingParams p;
  const double t = 0.3 + 1.5 * gen.next_uniform();
  switch (b % 9) {
    case 0: p.temperature = 0; break;
    case 1: p.temperature = t; break;
    case 2: p.temperature = t, p.top_k = 1 + static_cast<int64_t>(gen.next_below(40)); break;
    case 3: p.temperature = t, p.top_p = 0.05 + 0.9 * gen.next_uniform(); break;
    case 4: p.temperature = t, p.min_p = 0.01 + 0.5 * gen.next_uniform(); break;
    case 5: p.temperature = 0, p.repetition_penalty = 1.3, p.frequency_penalty = 0.2; break;
    case 6: p.temperature = t, p.repetition_penalty = 0.7, p.presence_penalty = 0.5; break;
    case 7:
      p.temperature = t, p.top_k = 50, p.top_p = 0.9, p.min_p = 0.05, p.repetition_penalty = 1.1;
      p.frequency_penalty = 0.1;
      break;
    default: p.temperature = t, p.top_k = 1000000, p.top_p = 0.999; break;
  }
  if (b % 4 == 1) {  // a logit bias on a few tokens, over every kind of row in turn
    for (int i = 0; i < 1 + static_cast<int>(gen.next_below(6)); ++i) {
      p.logit_bias.emplace_back(static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab))),
                               -100 + 200 * gen.next_uniform());
    }
  }
  return p;
}

// Everything a test needs to run the op and the Sampler side by side.
struct Batch {
  std::vector<SamplingParams> params;
  std::vector<std::vector<int32_t>> histories;  // ids whose counts start the rows' counts
  std::vector<int64_t> seeds, offsets;
};

Batch random_batch(int64_t batch, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  Batch out;
  for (int64_t b = 0; b < batch; ++b) {
    out.params.push_back(row_kind(b, vocab, gen));
    std::vector<int32_t> history;
    const auto length = static_cast<int>(gen.next_below(30));
    for (int i = 0; i < length; ++i)
      history.push_back(static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab))));
    out.histories.push_back(history);
    out.seeds.push_back(static_cast<int64_t>(gen.next_u64() >> 1));
    out.offsets.push_back(static_cast<int64_t>(gen.next_below(1000)));
  }
  return out;
}

SamplerRows rows_of(const Batch& batch, int64_t vocab, Device device, bool with_counts = true) {
  std::vector<float> params;
  for (const SamplingParams& p : batch.params) {
    const std::vector<float> row = p.row();
    params.insert(params.end(), row.begin(), row.end());
  }
  std::vector<LogitBias> biases;
  for (const SamplingParams& p : batch.params) biases.push_back(p.bias_row());
  SamplerRows rows = make_sampler_rows(params, batch.seeds, vocab,
                                       with_counts ? batch.histories : std::vector<std::vector<int32_t>>{}, device,
                                       biases);
  std::vector<int64_t> rng;
  for (size_t b = 0; b < batch.seeds.size(); ++b) {
    rng.push_back(batch.seeds[b]);
    rng.push_back(batch.offsets[b]);
  }
  rows.rng = Tensor::from_vector(rng, {static_cast<int64_t>(batch.seeds.size()), 2}, device);
  return rows;
}

// The ids Sampler::sample gives each row of logits [B, V] (advancing the samplers and histories).
std::vector<int32_t> sampler_ids(const Tensor& logits, std::vector<Sampler>& samplers,
                                 std::vector<std::vector<int32_t>>& histories) {
  const std::vector<float> values = logits.to(DType::f32).contiguous().to_vector<float>();
  const auto vocab = static_cast<size_t>(logits.size(1));
  std::vector<int32_t> ids;
  for (size_t b = 0; b < samplers.size(); ++b) {
    const int32_t id = samplers[b].sample(std::span<const float>(values.data() + b * vocab, vocab), histories[b]);
    histories[b].push_back(id);
    ids.push_back(id);
  }
  return ids;
}

std::vector<Sampler> samplers_of(const Batch& batch) {
  std::vector<Sampler> samplers;
  for (size_t b = 0; b < batch.params.size(); ++b) {
    SamplingParams p = batch.params[b];
    p.seed = static_cast<uint64_t>(batch.seeds[b]);
    samplers.emplace_back(p);
    samplers.back().generator().set_state(p.seed, static_cast<uint64_t>(batch.offsets[b]));
  }
  return samplers;
}

TEST(Sampling, UniformIsPhiloxFirstWordIn24Bits) {
  Generator gen(testing::fresh_seed());
  for (int i = 0; i < 1000; ++i) {
    const uint64_t seed = gen.next_u64(), offset = gen.next_u64() >> (i % 64);
    EXPECT_EQ(sampling::draw_uniform(seed, offset), uniform_from_bits(philox4x32(seed, 0, offset)[0]));
  }
}

TEST(Sampling, WeightsFollowExp) {
  EXPECT_EQ(sampling::weight_of_exponent(0.0f), sampling::kMaxWeight);
  EXPECT_EQ(sampling::weight_of_exponent(-21.5f), 0u);
  EXPECT_GE(sampling::weight_of_exponent(sampling::kMinExponent), 1u);
  for (float z = -21.0f; z < 0; z += 0.01f) {
    const double exact = std::ldexp(std::exp(static_cast<double>(z)), 31);
    EXPECT_NEAR(sampling::weight_of_exponent(z), exact, 1e-6 * exact + 1) << z;
  }
}

TEST(Sampling, CpuKernelEqualsTheSamplerRowByRowAndAdvancesTheState) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t batch = 27, vocab = 1000, steps = 4;
    const Batch setup = random_batch(batch, vocab, testing::fresh_seed());
    SamplerRows rows = rows_of(setup, vocab, Device::cpu());
    std::vector<Sampler> samplers = samplers_of(setup);
    std::vector<std::vector<int32_t>> histories = setup.histories;
    for (int64_t step = 0; step < steps; ++step) {
      Tensor logits = testing::random_tensor({batch, vocab}, dtype, Device::cpu(), -6, 6);
      // f64 logits with bits past f32's: the op must round them as the Sampler (given them in f32) sees them.
      if (dtype == DType::f64) logits = scale(logits, 1.0 / 3);
      const Tensor counts_before = rows.counts.clone();
      const std::vector<int64_t> rng_before = rows.rng.to_vector<int64_t>();
      const Tensor out = Tensor::full({batch}, -1, DType::i32);
      sample_tokens(logits, rows, out);
      const std::vector<int32_t> got = out.to_vector<int32_t>();
      EXPECT_EQ(got, sampler_ids(logits, samplers, histories)) << "step " << step;
      const std::vector<int64_t> rng_after = rows.rng.to_vector<int64_t>();
      const std::vector<int32_t> before = counts_before.to_vector<int32_t>(), after = rows.counts.to_vector<int32_t>();
      for (int64_t b = 0; b < batch; ++b) {
        EXPECT_EQ(rng_after[2 * b], rng_before[2 * b]) << "the seed of row " << b << " changed";
        EXPECT_EQ(rng_after[2 * b + 1], rng_before[2 * b + 1] + 1) << "row " << b;
        for (int64_t v = 0; v < vocab; ++v) {
          const size_t at = static_cast<size_t>(b * vocab + v);
          EXPECT_EQ(after[at], before[at] + (v == got[b] ? 1 : 0)) << "row " << b << " id " << v;
        }
      }
    }
  }
}

TEST(Sampling, StridedLogitsAndNarrowedStateGiveTheContiguousResult) {
  const int64_t max_batch = 12, batch = 7, steps = 3, vocab = 301;
  const Batch setup = random_batch(max_batch, vocab, testing::fresh_seed());
  const SamplerRows full = rows_of(setup, vocab, Device::cpu());
  // The same state twice: as narrowed views of the max_batch tensors, and as contiguous [batch] copies.
  SamplerRows narrowed{full.params.narrow(0, 0, batch), full.rng.narrow(0, 0, batch), full.counts.narrow(0, 0, batch),
                       full.bias.narrow(0, 0, batch)};
  SamplerRows compact{narrowed.params.clone(), narrowed.rng.clone(), narrowed.counts.clone(), narrowed.bias.clone()};
  for (int64_t step = 0; step < steps; ++step) {
    const Tensor sequence_logits = testing::random_tensor({batch, 5, vocab}, DType::f32, Device::cpu(), -4, 4);
    const Tensor last = sequence_logits.select(1, 4);  // row stride 5 * vocab
    const Tensor transposed = testing::random_tensor({vocab, batch}, DType::f32, Device::cpu(), -4, 4).t();
    for (const Tensor& logits : {last, transposed}) {
      const Tensor wide_out = Tensor::full({batch, 2}, -1, DType::i32);
      sample_tokens(logits, narrowed, wide_out.select(1, 1));  // a strided output
      const Tensor expected = sample_tokens(logits.contiguous(), compact);
      EXPECT_EQ(wide_out.select(1, 1).to_vector<int32_t>(), expected.to_vector<int32_t>());
      EXPECT_EQ(wide_out.select(1, 0).to_vector<int32_t>(), std::vector<int32_t>(batch, -1)) << "wrote past out";
    }
  }
  EXPECT_EQ(narrowed.rng.to_vector<int64_t>(), compact.rng.to_vector<int64_t>());
  EXPECT_EQ(narrowed.counts.to_vector<int32_t>(), compact.counts.to_vector<int32_t>());
  // Rows past the batch were not touched.
  const SamplerRows untouched = rows_of(setup, vocab, Device::cpu());
  EXPECT_EQ(full.rng.narrow(0, batch, max_batch - batch).to_vector<int64_t>(),
            untouched.rng.narrow(0, batch, max_batch - batch).to_vector<int64_t>());
  EXPECT_EQ(full.counts.narrow(0, batch, max_batch - batch).to_vector<int32_t>(),
            untouched.counts.narrow(0, batch, max_batch - batch).to_vector<int32_t>());
}

TEST(Sampling, WithoutCountsThereAreNoPenalties) {
  const int64_t batch = 9, vocab = 200;
  const Batch setup = random_batch(batch, vocab, testing::fresh_seed());
  const Tensor logits = testing::random_tensor({batch, vocab}, DType::f32, Device::cpu(), -5, 5);
  const std::vector<int32_t> got =
      sample_tokens(logits, rows_of(setup, vocab, Device::cpu(), false)).to_vector<int32_t>();
  std::vector<Sampler> samplers = samplers_of(setup);
  std::vector<std::vector<int32_t>> empty(batch);
  EXPECT_EQ(got, sampler_ids(logits, samplers, empty));
}

// OpenAI's logit_bias: -100 on the argmax moves a greedy row to the runner-up, +100 on any token makes it the
// choice of greedy and sampled rows, and the bias comes before the penalties (as transformers' sequence bias
// comes before its repetition penalty).
TEST(Sampling, LogitBiasMovesTheChoiceAndPrecedesThePenalties) {
  const int64_t vocab = 300;
  Generator gen(testing::fresh_seed());
  const Tensor logits = testing::random_tensor({1, vocab}, DType::f32, Device::cpu(), -5, 5);
  std::vector<float> x = logits.to_vector<float>();
  const auto argmax = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  std::vector<float> without = x;
  without[static_cast<size_t>(argmax)] = -1e30f;
  const auto runner_up = static_cast<int32_t>(std::max_element(without.begin(), without.end()) - without.begin());
  const auto lowest = static_cast<int32_t>(std::min_element(x.begin(), x.end()) - x.begin());
  auto choose = [&](SamplingParams p, const Tensor& row, const std::vector<std::vector<int32_t>>& histories = {}) {
    p.seed = gen.next_u64() >> 1;
    const SamplerRows rows = make_sampler_rows(p.row(), {static_cast<int64_t>(p.seed)}, vocab, histories,
                                               Device::cpu(), {p.bias_row()});
    const int32_t id = sample_tokens(row, rows).to_vector<int32_t>()[0];
    Sampler sampler(p);
    EXPECT_EQ(id, sampler.sample(row.to_vector<float>(), histories.empty() ? std::vector<int32_t>{} : histories[0]));
    return id;
  };
  EXPECT_EQ(choose({.temperature = 0}, logits), argmax);
  EXPECT_EQ(choose({.temperature = 0, .logit_bias = {{argmax, -100.0}}}, logits), runner_up);
  for (double temperature : {0.0, 0.7, 1.5}) {
    EXPECT_EQ(choose({.temperature = temperature, .logit_bias = {{lowest, 100.0}}}, logits), lowest) << temperature;
  }
  // Token 0 (logit 1, seen once) with a bias of 3 under a repetition penalty of 2: (1 + 3) / 2 = 2 when the bias
  // comes first, 1 / 2 + 3 = 3.5 when it comes after; token 1 (logit 2.5) is the greedy choice only in the first.
  std::vector<float> two(static_cast<size_t>(vocab), -10.0f);
  two[0] = 1.0f, two[1] = 2.5f;
  const Tensor row = Tensor::from_vector(two, {1, vocab});
  EXPECT_EQ(choose({.temperature = 0, .repetition_penalty = 2.0, .logit_bias = {{0, 3.0}}}, row, {{0}}), 1);
  EXPECT_EQ(choose({.temperature = 0, .repetition_penalty = 2.0, .logit_bias = {{0, 3.1}}}, row, {{7}}), 0);
}

TEST(Sampling, LogitBiasOutsideTheVocabularyIsAnError) {
  SamplingParams p;
  p.logit_bias = {{300, 1.0}};
  const std::string m = testing::error_message(
      [&] { make_sampler_rows(p.row(), {1}, 300, {}, Device::cpu(), {p.bias_row()}); });
  EXPECT_NE(m.find("logit bias token 300 of row 0 is outside the vocabulary of 300"), std::string::npos) << m;
  p.logit_bias = {{-1, 1.0}};
  EXPECT_THROW(p.check(), ValueError);
  p.logit_bias = {{5, NAN}};
  EXPECT_THROW(p.check(), ValueError);
}

// Many draws of one row (rows with one seed and consecutive offsets): frequencies against the softmax.
std::vector<int64_t> draw_counts(const std::vector<float>& logits, const SamplingParams& params, int64_t draws) {
  const auto vocab = static_cast<int64_t>(logits.size());
  std::vector<float> param_rows;
  for (int64_t i = 0; i < draws; ++i) {
    const std::vector<float> row = params.row();
    param_rows.insert(param_rows.end(), row.begin(), row.end());
  }
  std::vector<int64_t> rng;
  for (int64_t i = 0; i < draws; ++i) rng.insert(rng.end(), {1234567, i});
  SamplerRows rows = make_sampler_rows(param_rows, std::vector<int64_t>(draws, 0), vocab, {}, Device::cpu());
  rows.rng = Tensor::from_vector(rng, {draws, 2});
  const Tensor x = Tensor::from_vector(logits, {1, vocab}).expand({draws, vocab});  // stride-0 rows
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (int32_t id : sample_tokens(x, rows).to_vector<int32_t>()) ++counts[static_cast<size_t>(id)];
  return counts;
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
  std::vector<float> logits(16);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i) * 1.7f) * 2.0f;
  const int64_t draws = 200000;
  const std::vector<int64_t> counts = draw_counts(logits, {.temperature = 1.0}, draws);
  double max = *std::max_element(logits.begin(), logits.end()), total = 0;
  std::vector<double> p;
  for (float x : logits) total += std::exp(x - max);
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double expected = draws * std::exp(logits[i] - max) / total;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 45.0) << "15 degrees of freedom: P(chi2 > 45) < 1e-4";  // fixed seeds: deterministic
}

TEST(Sampling, TruncationsNeverReturnAnExcludedId) {
  // Sorted probabilities (T = 1): 0.4, 0.3, 0.2, 0.1 at ids 3, 1, 0, 2 plus a tail of tiny ones.
  std::vector<float> logits(64, -12.0f);
  logits[3] = std::log(0.4f), logits[1] = std::log(0.3f), logits[0] = std::log(0.2f), logits[2] = std::log(0.1f);
  auto seen = [&](const SamplingParams& p) {
    std::vector<int32_t> ids;
    const std::vector<int64_t> counts = draw_counts(logits, p, 20000);
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i] > 0) ids.push_back(static_cast<int32_t>(i));
    return ids;
  };
  EXPECT_EQ(seen({.top_k = 2}), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(seen({.top_p = 0.65}), (std::vector<int32_t>{1, 3}));  // 0.4 + 0.3 reaches 0.65
  EXPECT_EQ(seen({.top_p = 0.75}), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(seen({.min_p = 0.6}), (std::vector<int32_t>{1, 3}));  // p >= 0.24
  EXPECT_EQ(seen({.top_k = 3, .top_p = 0.95}), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(seen({.temperature = 0}), (std::vector<int32_t>{3}));
}

TEST(Sampling, BadArgumentsNameTheOpAndTheTensor) {
  const int64_t batch = 3, vocab = 10;
  const Batch setup = random_batch(batch, vocab, 1);
  const Tensor logits = Tensor::zeros({batch, vocab});
  const SamplerRows good = rows_of(setup, vocab, Device::cpu());
  auto message = [&](const Tensor& x, const SamplerRows& rows, const Tensor& out) -> std::string {
    try {
      sample_tokens(x, rows, out);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const Tensor out = Tensor::empty({batch}, DType::i32);
  auto expect = [&](const std::string& got, const std::string& tensor) {
    EXPECT_NE(got.find("sample_tokens"), std::string::npos) << got;
    EXPECT_NE(got.find(tensor), std::string::npos) << got;
  };
  EXPECT_EQ(message(logits, good, out), "");
  EXPECT_EQ(message(logits.to(DType::f64), good, out), "") << "an f64 model's logits";
  expect(message(logits.to(DType::i32), good, out), "logits");
  expect(message(Tensor::zeros({batch, 2, vocab}), good, out), "logits");
  expect(message(Tensor::zeros({batch, 0}), good, out), "logits");
  expect(message(Tensor(), good, out), "logits");
  auto with = [&](auto change) {
    SamplerRows rows = good;
    change(rows);
    return rows;
  };
  expect(message(logits, with([](SamplerRows& r) { r.params = r.params.to(DType::f64); }), out), "params");
  expect(message(logits, with([](SamplerRows& r) { r.params = r.params.narrow(1, 0, 7); }), out), "params");
  expect(message(logits, with([](SamplerRows& r) { r.params = r.params.narrow(0, 0, 2); }), out), "params");
  expect(message(logits, with([](SamplerRows& r) { r.params = Tensor(); }), out), "params");
  expect(message(logits, with([](SamplerRows& r) { r.rng = r.rng.to(DType::i32); }), out), "rng");
  expect(message(logits, with([](SamplerRows& r) { r.rng = r.rng.narrow(1, 0, 1); }), out), "rng");
  expect(message(logits, with([&](SamplerRows& r) { r.rng = r.rng.narrow(0, 0, 1).expand({batch, 2}); }), out), "rng");
  expect(message(logits, with([](SamplerRows& r) { r.counts = r.counts.to(DType::i64); }), out), "counts");
  expect(message(logits, with([](SamplerRows& r) { r.counts = r.counts.narrow(1, 0, 9); }), out), "counts");
  expect(message(logits, good, Tensor::empty({batch}, DType::i64)), "out");
  expect(message(logits, good, Tensor::empty({batch + 1}, DType::i32)), "out");
  expect(message(logits, good, Tensor::empty({1}, DType::i32).expand({batch})), "out");
}

// ---- greedy_only ----

std::vector<float> params_of(const std::vector<SamplingParams>& rows) {
  std::vector<float> params;
  for (const SamplingParams& p : rows) {
    const std::vector<float> row = p.row();
    params.insert(params.end(), row.begin(), row.end());
  }
  return params;
}

// The batch with every row made greedy (temperature 0), its penalties kept.
Batch greedy_batch(Batch batch) {
  for (SamplingParams& p : batch.params) p.temperature = 0;
  return batch;
}

// A greedy batch but for one random row (returned), which samples: a broken greedy_only promise.
std::pair<Batch, int64_t> greedy_but_one(int64_t batch, int64_t vocab) {
  Generator gen(testing::fresh_seed());
  const auto bad = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(batch)));
  Batch setup = greedy_batch(random_batch(batch, vocab, gen.next_u64()));
  setup.params[static_cast<size_t>(bad)].temperature = 0.7;
  return {setup, bad};
}

TEST(Sampling, MakeSamplerRowsPromisesGreedyOnlyWhenEveryRowIsGreedy) {
  const int64_t vocab = 50;
  Generator gen(testing::fresh_seed());
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t batch = 1 + static_cast<int64_t>(gen.next_below(9));
    std::vector<SamplingParams> rows(static_cast<size_t>(batch), SamplingParams{.temperature = 0});
    rows[gen.next_below(static_cast<uint64_t>(batch))].repetition_penalty = 1.2;  // penalties keep it greedy
    EXPECT_TRUE(make_sampler_rows(params_of(rows), std::vector<int64_t>(batch, 1), vocab, {}, Device::cpu()).greedy_only);
    rows[gen.next_below(static_cast<uint64_t>(batch))].temperature = 0.01 + gen.next_uniform();
    EXPECT_FALSE(make_sampler_rows(params_of(rows), std::vector<int64_t>(batch, 1), vocab, {}, Device::cpu()).greedy_only);
  }
}

TEST(Sampling, GreedyOnlyEqualsTheSamplerWithPenalties) {
  const int64_t batch = 18, vocab = 700, steps = 4;
  const Batch setup = greedy_batch(random_batch(batch, vocab, testing::fresh_seed()));
  SamplerRows rows = rows_of(setup, vocab, Device::cpu());
  rows.greedy_only = true;
  std::vector<Sampler> samplers = samplers_of(setup);
  std::vector<std::vector<int32_t>> histories = setup.histories;
  // The same logits every step: a penalized row's choice is then penalized in the next step and moves.
  const Tensor logits = testing::random_tensor({batch, vocab}, DType::f32, Device::cpu(), -1, 1);
  std::vector<std::vector<int32_t>> chosen;
  for (int64_t step = 0; step < steps; ++step) {
    const std::vector<int32_t> got = sample_tokens(logits, rows).to_vector<int32_t>();
    EXPECT_EQ(got, sampler_ids(logits, samplers, histories)) << "step " << step;
    chosen.push_back(got);
  }
  bool moved = false;
  for (int64_t b = 0; b < batch; ++b) moved = moved || chosen[0][static_cast<size_t>(b)] != chosen[1][static_cast<size_t>(b)];
  EXPECT_TRUE(moved) << "no penalized row changed its choice: the penalties did nothing";
}

TEST(Sampling, GreedyOnlyWithASampledRowThrowsAndChangesNothing) {
  const int64_t batch = 5, vocab = 300;
  const auto [setup, bad] = greedy_but_one(batch, vocab);
  SamplerRows rows = rows_of(setup, vocab, Device::cpu());
  rows.greedy_only = true;
  const std::vector<int64_t> rng = rows.rng.to_vector<int64_t>();
  const std::vector<int32_t> counts = rows.counts.to_vector<int32_t>();
  const Tensor logits = testing::random_tensor({batch, vocab}, DType::bf16, Device::cpu(), -4, 4);
  const Tensor out = Tensor::full({batch}, -1, DType::i32);
  const std::string message = testing::message_of<ValueError>([&] { sample_tokens(logits, rows, out); });
  EXPECT_NE(message.find("sample_tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("greedy_only"), std::string::npos) << message;
  EXPECT_NE(message.find("row " + std::to_string(bad)), std::string::npos) << message;
  EXPECT_EQ(rows.rng.to_vector<int64_t>(), rng);
  EXPECT_EQ(rows.counts.to_vector<int32_t>(), counts);
  EXPECT_EQ(out.to_vector<int32_t>(), std::vector<int32_t>(batch, -1));
  rows.greedy_only = false;  // no promise: the same rows sample
  EXPECT_NO_THROW(sample_tokens(logits, rows, out));
}

// ---- CUDA against the CPU ----

SamplerRows on_cuda(const SamplerRows& r) {
  auto moved = [](const Tensor& t) { return t.defined() ? t.to(Device::cuda(0)) : Tensor(); };
  return SamplerRows{r.params.to(Device::cuda(0)), r.rng.to(Device::cuda(0)), moved(r.counts), moved(r.bias),
                     r.greedy_only};
}

// Runs `steps` calls on the CPU and on cuda:0 from the same state and logits (uniform in [low, 8)); ids and
// state must be identical. greedy_only: every row made greedy (penalties kept) and the promise made.
void expect_cuda_equals_cpu(int64_t batch, int64_t vocab, DType dtype, int steps, bool strided,
                            bool greedy_only = false, double low = -8) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " batch " + std::to_string(batch) + " vocab " + std::to_string(vocab) +
               (greedy_only ? " greedy_only" : ""));
  Batch setup = random_batch(batch, vocab, testing::fresh_seed());
  if (greedy_only) setup = greedy_batch(setup);
  SamplerRows cpu = rows_of(setup, vocab, Device::cpu());
  cpu.greedy_only = greedy_only;
  SamplerRows gpu = on_cuda(cpu);
  for (int step = 0; step < steps; ++step) {
    Tensor logits = testing::random_tensor({batch, strided ? 3 : 1, vocab}, dtype, Device::cpu(), low, 8).select(1, 0);
    const Tensor gpu_logits = strided ? logits.to(Device::cuda(0)) : logits.contiguous().to(Device::cuda(0));
    const Tensor gpu_out = Tensor::empty({batch}, DType::i32, Device::cuda(0));
    const std::vector<int32_t> expected = sample_tokens(logits, cpu).to_vector<int32_t>();
    cuda::synchronize(0);
    cuda::reset_transfer_stats();
    sample_tokens(gpu_logits, gpu, gpu_out);
    cuda::synchronize(0);
    const cuda::TransferStats moved = cuda::transfer_stats();
    EXPECT_EQ(moved.host_to_device, 0u) << "sample_tokens copied host -> device";
    EXPECT_EQ(moved.device_to_host, 0u) << "sample_tokens copied device -> host";
    EXPECT_EQ(gpu_out.to_vector<int32_t>(), expected) << "step " << step;
  }
  EXPECT_EQ(gpu.rng.to_vector<int64_t>(), cpu.rng.to_vector<int64_t>());
  EXPECT_EQ(gpu.counts.to_vector<int32_t>(), cpu.counts.to_vector<int32_t>());
}

class SamplingCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(Device::cuda(0)); }
};

TEST_F(SamplingCudaTest, EqualsTheCpuOnEveryDtype) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    expect_cuda_equals_cpu(27, 1000, dtype, 3, /*strided=*/true);
    expect_cuda_equals_cpu(5, 33, dtype, 2, /*strided=*/false);
  }
}

TEST_F(SamplingCudaTest, EqualsTheCpuAtQwenVocabularyAndBatch32) {
  expect_cuda_equals_cpu(1, 151936, DType::bf16, 3, /*strided=*/true);
  expect_cuda_equals_cpu(32, 151936, DType::f32, 2, /*strided=*/false);
}

// Ids where a row's maximum sits. The kernels cut the vocabulary into chunks of a multiple of 256 logits, so
// m * 256 - 1 and m * 256 straddle a possible chunk boundary; every kind puts the first maximum somewhere else.
std::vector<int64_t> tie_ids(int64_t kind, int64_t vocab, Generator& gen) {
  const int64_t boundaries = (vocab - 1) / 256;  // m * 256 <= vocab - 1 for m in [1, boundaries]
  const int64_t m = boundaries > 0 ? 1 + static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(boundaries))) : 0;
  std::vector<int64_t> ids;
  switch (kind % 6) {
    case 0: ids = m > 0 ? std::vector<int64_t>{m * 256 - 1, m * 256} : std::vector<int64_t>{0, vocab - 1}; break;
    case 1: ids = {m * 256, vocab - 1}; break;  // m = 0: the first and the last id
    case 2: ids = {vocab - 1}; break;           // the last id alone
    case 3: ids = {0, vocab - 1}; break;
    case 4:  // the last id of every 256-block and the vocabulary's last
      for (int64_t v = 255; v < vocab; v += 256) ids.push_back(v);
      ids.push_back(vocab - 1);
      break;
    default:  // the first id of every 256-block but the first, and the vocabulary's last
      for (int64_t v = 256; v < vocab; v += 256) ids.push_back(v);
      ids.push_back(vocab - 1);
      break;
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

TEST_F(SamplingCudaTest, ArgmaxTiesAcrossChunksGoToTheLowestId) {
  Generator gen(testing::fresh_seed());
  for (const auto& [batch, vocab] : {std::pair<int64_t, int64_t>{1, 151936}, {8, 151936}, {32, 151936}, {7, 4097},
                                     {3, 1000}, {2, 256}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const bool greedy_only : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " batch " + std::to_string(batch) + " vocab " +
                     std::to_string(vocab) + (greedy_only ? " greedy_only" : ""));
        // The maximum 9 at the tied ids, everything else in [-8, 8): exact in bf16 too, and nothing else ties.
        std::vector<float> values = testing::random_tensor({batch, vocab}, DType::f32, Device::cpu(), -8, 8,
                                                           gen.next_u64()).to_vector<float>();
        std::vector<SamplingParams> params;
        std::vector<int32_t> first;  // the lowest tied id of each row
        const auto kind_offset = static_cast<int64_t>(gen.next_below(6));
        for (int64_t b = 0; b < batch; ++b) {
          const std::vector<int64_t> ties = tie_ids(b + kind_offset, vocab, gen);
          for (int64_t id : ties) values[static_cast<size_t>(b * vocab + id)] = 9.0f;
          first.push_back(static_cast<int32_t>(ties.front()));
          // Without the promise every other row (a lone row too) samples at T = 0.3: every tied id weighs the
          // most there.
          const bool sampled = !greedy_only && (b % 2 == 1 || batch == 1);
          params.push_back({.temperature = sampled ? 0.3 : 0.0});
        }
        const Tensor logits = Tensor::from_vector(values, {batch, vocab}).to(dtype);
        std::vector<int64_t> seeds;
        for (int64_t b = 0; b < batch; ++b) seeds.push_back(static_cast<int64_t>(gen.next_u64() >> 1));
        SamplerRows cpu = make_sampler_rows(params_of(params), seeds, vocab, {}, Device::cpu());
        cpu.greedy_only = greedy_only;
        SamplerRows gpu = on_cuda(cpu);
        const std::vector<int32_t> expected = sample_tokens(logits, cpu).to_vector<int32_t>();
        const std::vector<int32_t> got = sample_tokens(logits.to(Device::cuda(0)), gpu).to_vector<int32_t>();
        EXPECT_EQ(got, expected);
        for (int64_t b = 0; b < batch; ++b) {
          if (params[static_cast<size_t>(b)].temperature == 0) {
            EXPECT_EQ(got[static_cast<size_t>(b)], first[static_cast<size_t>(b)]) << "row " << b;
          }
        }
        EXPECT_EQ(gpu.rng.to_vector<int64_t>(), cpu.rng.to_vector<int64_t>());
      }
    }
  }
}

TEST_F(SamplingCudaTest, VocabulariesThatAreNoMultipleOfTheChunk) {
  for (const auto& [batch, vocab] : {std::pair<int64_t, int64_t>{1, 1}, {3, 255}, {2, 257}, {5, 1025}, {4, 4097},
                                     {9, 70001}, {32, 151936}, {8, 151937}, {1, 151935}}) {
    for (const bool greedy_only : {false, true})
      expect_cuda_equals_cpu(batch, vocab, DType::bf16, 2, /*strided=*/false, greedy_only);
  }
}

TEST_F(SamplingCudaTest, GreedyOnlyAppliesPenaltiesAndCountsLikeTheCpu) {
  for (const auto& [batch, vocab] : {std::pair<int64_t, int64_t>{32, 151936}, {9, 3000}}) {  // rows 5-7 penalized
    SCOPED_TRACE("batch " + std::to_string(batch) + " vocab " + std::to_string(vocab));
    const Batch setup = greedy_batch(random_batch(batch, vocab, testing::fresh_seed()));
    SamplerRows cpu = rows_of(setup, vocab, Device::cpu());
    cpu.greedy_only = true;
    SamplerRows fast = on_cuda(cpu), general = on_cuda(cpu);
    general.greedy_only = false;
    // The same logits every step: a penalized row's last choice is penalized in the next step and moves.
    const Tensor logits = testing::random_tensor({batch, vocab}, DType::f32, Device::cpu(), -1, 1);
    const Tensor gpu_logits = logits.to(Device::cuda(0));
    std::vector<std::vector<int32_t>> chosen;
    for (int step = 0; step < 4; ++step) {
      const std::vector<int32_t> expected = sample_tokens(logits, cpu).to_vector<int32_t>();
      EXPECT_EQ(sample_tokens(gpu_logits, fast).to_vector<int32_t>(), expected) << "greedy_only, step " << step;
      EXPECT_EQ(sample_tokens(gpu_logits, general).to_vector<int32_t>(), expected) << "general, step " << step;
      chosen.push_back(expected);
    }
    EXPECT_NE(chosen[0], chosen[1]) << "no penalized row changed its choice: the penalties did nothing";
    for (const SamplerRows* gpu : {&fast, &general}) {
      EXPECT_EQ(gpu->rng.to_vector<int64_t>(), cpu.rng.to_vector<int64_t>());
      EXPECT_EQ(gpu->counts.to_vector<int32_t>(), cpu.counts.to_vector<int32_t>());
    }
  }
}

TEST_F(SamplingCudaTest, GreedyOnlyWithASampledRowIsAnErrorAtTheNextSynchronization) {
  const int64_t batch = 6, vocab = 5000;
  const auto [setup, bad] = greedy_but_one(batch, vocab);
  SamplerRows cpu = rows_of(setup, vocab, Device::cpu());
  cpu.greedy_only = true;
  const SamplerRows gpu = on_cuda(cpu);
  const Tensor logits = testing::random_tensor({batch, vocab}, DType::bf16, Device::cpu(), -4, 4);
  const Tensor out = Tensor::full({batch}, -1, DType::i32, Device::cuda(0));
  cuda::synchronize(0);
  sample_tokens(logits.to(Device::cuda(0)), gpu, out);  // no host wait: the call itself cannot know
  const std::string message = testing::message_of<ValueError>([] { cuda::synchronize(0); });
  EXPECT_NE(message.find("sample_tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("greedy_only"), std::string::npos) << message;
  EXPECT_NE(message.find("row: " + std::to_string(bad)), std::string::npos) << message;
  EXPECT_NO_THROW(cuda::synchronize(0)) << "the report is cleared once raised";
  // Every row, the bad one included, got its greedy id (in range, nothing else reported over the error).
  Batch all_greedy = setup;
  all_greedy.params[static_cast<size_t>(bad)].temperature = 0;
  EXPECT_EQ(out.to_vector<int32_t>(), sample_tokens(logits, rows_of(all_greedy, vocab, Device::cpu())).to_vector<int32_t>());
}

TEST_F(SamplingCudaTest, MixedGreedyAndSampledRowsEqualTheCpu) {
  // Flat logits (every token a candidate) and peaky ones (a few thousand candidates, like a real model's).
  for (const double low : {-8.0, -300.0}) {
    expect_cuda_equals_cpu(32, 151936, DType::bf16, 2, /*strided=*/false, /*greedy_only=*/false, low);
    expect_cuda_equals_cpu(13, 20000, DType::f16, 3, /*strided=*/true, /*greedy_only=*/false, low);
  }
}

TEST_F(SamplingCudaTest, NarrowedStateOnTheDevice) {
  const int64_t max_batch = 9, batch = 4, vocab = 500;
  const Batch setup = random_batch(max_batch, vocab, testing::fresh_seed());
  SamplerRows cpu = rows_of(setup, vocab, Device::cpu());
  SamplerRows gpu = on_cuda(cpu);
  auto narrow = [&](const SamplerRows& r) {
    return SamplerRows{r.params.narrow(0, 0, batch), r.rng.narrow(0, 0, batch), r.counts.narrow(0, 0, batch),
                       r.bias.narrow(0, 0, batch)};
  };
  for (int step = 0; step < 3; ++step) {
    const Tensor logits = testing::random_tensor({batch, vocab}, DType::f32, Device::cpu(), -5, 5);
    EXPECT_EQ(sample_tokens(logits.to(Device::cuda(0)), narrow(gpu)).to_vector<int32_t>(),
              sample_tokens(logits, narrow(cpu)).to_vector<int32_t>());
  }
  EXPECT_EQ(gpu.rng.to_vector<int64_t>(), cpu.rng.to_vector<int64_t>());
  EXPECT_EQ(gpu.counts.to_vector<int32_t>(), cpu.counts.to_vector<int32_t>());
}

TEST_F(SamplingCudaTest, TensorsOnAnotherDeviceAreErrors) {
  const int64_t batch = 2, vocab = 10;
  const SamplerRows cpu = rows_of(random_batch(batch, vocab, 1), vocab, Device::cpu());
  const SamplerRows gpu = on_cuda(cpu);
  const Tensor logits = Tensor::zeros({batch, vocab}, DType::f32, Device::cuda(0));
  EXPECT_THROW(sample_tokens(logits, SamplerRows{cpu.params, gpu.rng, gpu.counts, gpu.bias}), DeviceError);
  EXPECT_THROW(sample_tokens(logits, SamplerRows{gpu.params, cpu.rng, gpu.counts, gpu.bias}), DeviceError);
  EXPECT_THROW(sample_tokens(logits, SamplerRows{gpu.params, gpu.rng, cpu.counts, gpu.bias}), DeviceError);
  EXPECT_THROW(sample_tokens(logits, SamplerRows{gpu.params, gpu.rng, gpu.counts, cpu.bias}), DeviceError);
  EXPECT_THROW(sample_tokens(logits, gpu, Tensor::empty({batch}, DType::i32)), DeviceError);
  EXPECT_THROW(sample_tokens(logits.to(Device::cpu()), gpu), DeviceError);
}

}  // namespace
}  // namespace microllm
