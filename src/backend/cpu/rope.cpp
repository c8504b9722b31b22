// CPU rotary position embedding, and the inverse frequencies (with HF's rope scaling) that every backend uses.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace cpu {
namespace {

// inv_freq[i] for i in [0, D/2), computed in A the way transformers computes it in f32
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters, _compute_llama3_parameters).
// Python floats meet f32 tensors there, so they round to A; `scalar / tensor` is reciprocal(tensor) * scalar
// in torch (Tensor.__rtruediv__), which is why the divisions below are written that way.
template <typename A>
std::vector<A> inv_freq_as(const RopeParams& params, int64_t head_dim) {
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

}  // namespace

// The f32 frequencies behind the public rope_inv_freq (src/ops/rope.cpp declares this; params are checked there).
std::vector<float> rope_inv_freq_f32(const RopeParams& params, int64_t head_dim) {
  return inv_freq_as<float>(params, head_dim);
}

}  // namespace cpu

// x [B, T, H, D] any strides, positions [B, T] (maybe expanded), out [B, T, H, D] contiguous.
// angle = position * inv_freq[i] in f32 (f64 for f64, so the f64 gradient check is exact). Each pair (a, b)
// turns by the angle: a' = a cos - b sin, b' = b cos + a sin; inverse turns by -angle (the transpose).
void CpuBackend::rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
                      const Tensor& out) {
  cpu::visit_float(x.dtype(), "rope", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t seq = x.size(1), heads = x.size(2), dim = x.size(3), half = dim / 2;
    const std::vector<A> inv_freq = cpu::inv_freq_as<A>(params, dim);
    // Pair i is (i, i + D/2) in split_half and (2i, 2i + 1) in interleaved.
    const bool split = params.layout == RopeLayout::split_half;
    const int64_t pair_step = split ? 1 : 2, partner = split ? half : 1;
    const T* xs = static_cast<const T*>(x.data_ptr());
    T* ys = static_cast<T*>(out.data_ptr());
    const Strides xst = x.strides();
    const int64_t token_grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(heads * dim, 1));

    detail::parallel_for(0, x.size(0) * seq, token_grain, [&](int64_t lo, int64_t hi) {
      std::vector<A> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));  // of one token
      for (int64_t token = lo; token < hi; ++token) {
        const int64_t b = token / seq, t = token % seq;
        const auto pos = static_cast<A>(cpu::load_index(positions, b * positions.stride(0) + t * positions.stride(1)));
        for (int64_t i = 0; i < half; ++i) {
          const A angle = pos * inv_freq[static_cast<size_t>(i)];
          cos_t[static_cast<size_t>(i)] = std::cos(angle);
          sin_t[static_cast<size_t>(i)] = inverse ? -std::sin(angle) : std::sin(angle);
        }
        for (int64_t head = 0; head < heads; ++head) {
          const T* x_head = xs + b * xst[0] + t * xst[1] + head * xst[2];
          T* y_head = ys + (token * heads + head) * dim;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t first = i * pair_step, second = first + partner;
            const A a = cpu::load(x_head + first * xst[3]);
            const A c = cpu::load(x_head + second * xst[3]);
            const A cs = cos_t[static_cast<size_t>(i)], sn = sin_t[static_cast<size_t>(i)];
            cpu::store(y_head + first, a * cs - c * sn);
            cpu::store(y_head + second, c * cs + a * sn);
          }
        }
      }
    });
  });
}

}  // namespace microllm
