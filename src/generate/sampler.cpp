#include "microllm/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "microllm/backend/sampling_math.h"
#include "microllm/core/error.h"

namespace microllm::generate {

void SamplingParams::check() const {
  MICROLLM_CHECK(temperature >= 0 && std::isfinite(temperature), ValueError, "sampler",
                 "temperature must be >= 0, got ", temperature);
  MICROLLM_CHECK(top_k >= 0, ValueError, "sampler", "top_k must be >= 0, got ", top_k);
  MICROLLM_CHECK(top_p > 0 && top_p <= 1, ValueError, "sampler", "top_p must be in (0, 1], got ", top_p);
  MICROLLM_CHECK(min_p >= 0 && min_p < 1, ValueError, "sampler", "min_p must be in [0, 1), got ", min_p);
  MICROLLM_CHECK(repetition_penalty > 0 && std::isfinite(repetition_penalty), ValueError, "sampler",
                 "repetition_penalty must be > 0, got ", repetition_penalty);
  for (const auto& [id, bias] : logit_bias) {
    MICROLLM_CHECK(id >= 0, ValueError, "sampler", "logit_bias token id must be >= 0, got ", id);
    MICROLLM_CHECK(std::isfinite(bias), ValueError, "sampler", "logit_bias of token ", id, " is not finite: ", bias);
  }
}

Sampler::Sampler(SamplingParams params) : params_(params), gen_(params.seed) { params_.check(); }

std::vector<float> SamplingParams::row() const {
  std::vector<float> r(sampling::kParamCount, 0.0f);
  r[sampling::kTemperature] = static_cast<float>(temperature);
  // top_k beyond 2^24 is not exact in f32, but any k at least the vocabulary means "off" anyway.
  r[sampling::kTopK] = static_cast<float>(std::min<int64_t>(top_k, int64_t{1} << 24));
  r[sampling::kTopP] = static_cast<float>(top_p);
  r[sampling::kMinP] = static_cast<float>(min_p);
  r[sampling::kRepetitionPenalty] = static_cast<float>(repetition_penalty);
  r[sampling::kPresencePenalty] = static_cast<float>(presence_penalty);
  r[sampling::kFrequencyPenalty] = static_cast<float>(frequency_penalty);
  r[sampling::kLogitBias] = logit_bias.empty() ? 0.0f : 1.0f;
  return r;
}

std::vector<std::pair<int32_t, float>> SamplingParams::bias_row() const {
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [id, bias] : logit_bias) out.emplace_back(id, static_cast<float>(bias));
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto vocab = static_cast<int64_t>(logits.size());
  MICROLLM_CHECK(vocab > 0, ValueError, "sampler", "empty logits");
  const std::vector<float> row = params_.row();
  const sampling::RowParams p = sampling::row_params(row.data(), 1);
  std::vector<int32_t> counts;
  sampling::RowState state;
  if (p.penalized()) {
    counts.assign(static_cast<size_t>(vocab), 0);
    for (int32_t id : history) {
      if (id >= 0 && id < vocab) ++counts[static_cast<size_t>(id)];
    }
    state.counts = counts.data();
    state.counts_stride = 1;
  }
  std::vector<float> bias;
  if (p.biased()) {
    bias.assign(static_cast<size_t>(vocab), 0.0f);
    for (const auto& [id, value] : params_.bias_row()) {
      MICROLLM_CHECK(id < vocab, ValueError, "sampler", "logit_bias token ", id, " is outside the vocabulary of ",
                     vocab);
      bias[static_cast<size_t>(id)] = value;
    }
    state.bias = bias.data();
    state.bias_stride = 1;
  }
  // One draw per call, greedy or not, as sample_tokens advances a row's offset once per call.
  const float u = sampling::draw_uniform(gen_.seed(), gen_.reserve(1));
  std::vector<float> x(logits.begin(), logits.end());
  std::vector<uint64_t> keys;
  return sampling::sample_row(x, state, p, u, keys);
}

}  // namespace microllm::generate
