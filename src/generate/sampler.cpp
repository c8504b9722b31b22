#include "microllm/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "microllm/core/error.h"

namespace microllm::generate {

Sampler::Sampler(SamplingParams params) : params_(params), gen_(params.seed) {
  MICROLLM_CHECK(params_.temperature >= 0 && std::isfinite(params_.temperature), ValueError, "sampler",
                 "temperature must be >= 0, got ", params_.temperature);
  MICROLLM_CHECK(params_.top_k >= 0, ValueError, "sampler", "top_k must be >= 0, got ", params_.top_k);
  MICROLLM_CHECK(params_.top_p > 0 && params_.top_p <= 1, ValueError, "sampler", "top_p must be in (0, 1], got ",
                 params_.top_p);
  MICROLLM_CHECK(params_.min_p >= 0 && params_.min_p < 1, ValueError, "sampler", "min_p must be in [0, 1), got ",
                 params_.min_p);
  MICROLLM_CHECK(params_.repetition_penalty > 0, ValueError, "sampler", "repetition_penalty must be > 0, got ",
                 params_.repetition_penalty);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto vocab = static_cast<int64_t>(logits.size());
  MICROLLM_CHECK(vocab > 0, ValueError, "sampler", "empty logits");
  std::vector<double> x(logits.begin(), logits.end());
  if (params_.repetition_penalty != 1.0 || params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) {
    std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
    for (int32_t id : history) {
      if (id >= 0 && id < vocab) ++count[static_cast<size_t>(id)];
    }
    for (int64_t v = 0; v < vocab; ++v) {
      const int64_t n = count[static_cast<size_t>(v)];
      if (n == 0) continue;
      double& l = x[static_cast<size_t>(v)];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= params_.presence_penalty + params_.frequency_penalty * static_cast<double>(n);
    }
  }
  if (params_.temperature == 0) {  // greedy: the first maximum
    return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  }
  // Candidates sorted by logit (ties: lower id first), then truncated by top-k, min-p and top-p.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  size_t keep = order.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  const double max_logit = x[static_cast<size_t>(order[0])] / params_.temperature;
  std::vector<double> p(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp(x[static_cast<size_t>(order[i])] / params_.temperature - max_logit);
    total += p[i];
  }
  for (double& v : p) v /= total;
  if (params_.min_p > 0) {  // p[0] is the largest
    size_t k = 1;
    while (k < keep && p[k] >= params_.min_p * p[0]) ++k;
    keep = k;
  }
  if (params_.top_p < 1) {  // the smallest prefix whose mass reaches top_p
    double mass = 0;
    size_t k = 0;
    while (k < keep && mass < params_.top_p) mass += p[k++];
    keep = std::max<size_t>(k, 1);
  }
  double kept_mass = 0;
  for (size_t i = 0; i < keep; ++i) kept_mass += p[i];
  const double u = gen_.next_uniform() * kept_mass;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += p[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

}  // namespace microllm::generate
