// The inverse frequencies of rotary embeddings, with Hugging Face's rope scaling. Every backend takes its
// frequencies from here, so CPU and CUDA rotate by the same angles; rope_inv_freq (microllm/ops/rope.h) returns
// them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "microllm/backend/kernel_params.h"

namespace microllm {

// inv_freq[i] for i in [0, D/2), computed in A the way transformers computes it in f32
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
// _compute_yarn_parameters, _compute_longrope_parameters). dynamic keeps the default frequencies (kernel_params.h).
// Python floats meet f32 tensors there, so they round to A; `scalar / tensor` is reciprocal(tensor) * scalar
// in torch (Tensor.__rtruediv__), which is why the divisions below are written that way.
template <typename A>
std::vector<A> rope_inv_freq_as(const RopeParams& params, int64_t head_dim) {
  const auto half = static_cast<size_t>(head_dim / 2);
  std::vector<A> inv_freq(half);
  const A theta = static_cast<A>(params.theta);
  for (size_t i = 0; i < half; ++i) {
    const A exponent = static_cast<A>(2 * i) / static_cast<A>(head_dim);
    inv_freq[i] = A(1) / std::pow(theta, exponent);
  }
  const RopeScaling& s = params.scaling;
  if (s.type == RopeScalingType::linear) {
    for (A& f : inv_freq) f /= static_cast<A>(s.factor);
  } else if (s.type == RopeScalingType::llama3) {
    // Long wavelengths (low frequencies) are divided by factor, short ones kept, the band between blended.
    const auto old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const A factor = static_cast<A>(s.factor);
    const A low_freq_factor = static_cast<A>(s.low_freq_factor);
    const A low_freq_wavelen = static_cast<A>(old_ctx / s.low_freq_factor);
    const A high_freq_wavelen = static_cast<A>(old_ctx / s.high_freq_factor);
    const A band = static_cast<A>(s.high_freq_factor - s.low_freq_factor);
    const A two_pi = static_cast<A>(2 * M_PI);
    for (A& f : inv_freq) {
      const A wavelen = (A(1) / f) * two_pi;
      const A f_llama = wavelen > low_freq_wavelen ? f / factor : f;
      const A smooth = ((A(1) / wavelen) * static_cast<A>(old_ctx) - low_freq_factor) / band;
      const A smoothed = (A(1) - smooth) * f_llama / factor + smooth * f_llama;
      const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = is_medium ? smoothed : f_llama;
    }
  } else if (s.type == RopeScalingType::yarn) {
    // Frequencies that turn more than beta_fast times over the original context keep their value, those that
    // turn fewer than beta_slow times are divided by factor, a linear ramp between (_compute_yarn_parameters).
    const double two_pi = 2 * M_PI, log_base = std::log(params.theta), dim = static_cast<double>(head_dim);
    const auto old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const auto correction_dim = [&](double rotations) {
      return dim * std::log(old_ctx / (rotations * two_pi)) / (2 * log_base);
    };
    const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(s.beta_slow)), dim - 1);
    if (low == high) high += 0.001;  // no division by zero in the ramp
    const A factor = static_cast<A>(s.factor);
    for (size_t i = 0; i < half; ++i) {
      const A pos_freq = std::pow(theta, static_cast<A>(2 * i) / static_cast<A>(head_dim));
      const A ramp = std::clamp((static_cast<A>(i) - static_cast<A>(low)) / static_cast<A>(high - low), A(0), A(1));
      const A extrapolation = A(1) - ramp;
      inv_freq[i] = (A(1) / (factor * pos_freq)) * (A(1) - extrapolation) + (A(1) / pos_freq) * extrapolation;
    }
  } else if (s.type == RopeScalingType::longrope) {
    for (size_t i = 0; i < half; ++i) {
      const A exponent = static_cast<A>(2 * i) / static_cast<A>(head_dim);
      inv_freq[i] = A(1) / (static_cast<A>(s.frequency_factors.at(i)) * std::pow(theta, exponent));
    }
  }
  return inv_freq;
}

// How much yarn and longrope scale cos and sin (transformers' attention_scaling): q and k both, so the attention
// scores by its square. 1 for the other types.
inline double rope_attention_factor(const RopeScaling& s) {
  if (s.type != RopeScalingType::yarn && s.type != RopeScalingType::longrope) return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.factor <= 1) return 1.0;
  if (s.type == RopeScalingType::yarn) return 0.1 * std::log(s.factor) + 1.0;
  return std::sqrt(1 + std::log(s.factor) / std::log(static_cast<double>(s.original_max_position_embeddings)));
}

}  // namespace microllm
