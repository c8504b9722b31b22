// The inverse frequencies of rotary embeddings, with Hugging Face's rope scaling. Every backend takes its
// frequencies from here, so CPU and CUDA rotate by the same angles; rope_inv_freq (microllm/ops/rope.h) returns
// them.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "microllm/backend/kernel_params.h"

namespace microllm {

// inv_freq[i] for i in [0, D/2), computed in A the way transformers computes it in f32
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters, _compute_llama3_parameters).
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
  }
  return inv_freq;
}

}  // namespace microllm
