// The per-element formulas of the optimizer kernels, shared by the CPU and CUDA backends so both compute
// the same update (internal header). Everything is f32: masters, gradients and the math; moments are
// stored in f32 or bf16.
#pragma once

#include <cmath>
#include <cstdint>

#include "microllm/backend/backend.h"
#include "microllm/backend/portability.h"
#include "microllm/core/float_formats.h"

namespace microllm::optim_math {

// The scalars of one AdamW step, in f32, as every element uses them.
struct AdamWScalars {
  float beta1, beta2, eps;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  uint64_t seed;       // stochastic rounding of bf16 moments (the step count)
};

struct SgdScalars {
  float lr, momentum, dampening;
  bool nesterov, first_step;
  uint64_t seed;
};

// The scalars of a step as the backends receive it (host code).
inline AdamWScalars adamw_scalars(const AdamWStep& step) {
  return {static_cast<float>(step.beta1),
          static_cast<float>(step.beta2),
          static_cast<float>(step.eps),
          static_cast<float>(step.lr / step.bias_correction1),
          static_cast<float>(1.0 / std::sqrt(step.bias_correction2)),
          static_cast<uint64_t>(step.step)};
}
inline SgdScalars sgd_scalars(const SgdStep& step) {
  return {static_cast<float>(step.lr),
          static_cast<float>(step.momentum),
          static_cast<float>(step.dampening),
          step.nesterov,
          step.first_step,
          static_cast<uint64_t>(step.step)};
}

// A 64-bit mix (splitmix64's finalizer): the rounding bits of element `index` of tensor `tensor`.
MICROLLM_HD inline uint32_t rounding_bits(uint64_t seed, uint64_t tensor, uint64_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (tensor << 40) ^ index;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x);
}

// Moments load as f32; bf16 moments store with stochastic rounding (the 16 random low bits are added
// before truncation), so an update smaller than half a bf16 ulp still moves the moment on average:
// with round-to-nearest, v = 0.999 v + small would never change.
MICROLLM_HD inline float load_moment(float v) { return v; }
MICROLLM_HD inline float load_moment(bf16 v) { return to_float(v); }
MICROLLM_HD inline void store_moment(float* p, float v, uint32_t) { *p = v; }
MICROLLM_HD inline void store_moment(bf16* p, float v, uint32_t bits) {
  const uint32_t u = detail::float_bits(v);
  if (detail::is_nan_bits(u) || detail::is_inf_bits(u)) {
    *p = bf16_from_float(v);
    return;
  }
  const uint32_t rounded = u + (bits & 0xFFFFu);  // a carry past the largest finite value gives Inf
  *p = bf16{static_cast<uint16_t>(rounded >> 16)};
}

// One element of AdamW. decay = 1 - lr * weight_decay of this tensor; g already carries the grad scale.
template <typename M>
MICROLLM_HD inline void adamw_element(float& p, float g, M* m, M* v, float decay, const AdamWScalars& s,
                                      uint32_t bits) {
  const float m_new = s.beta1 * load_moment(*m) + (1.0f - s.beta1) * g;
  const float v_new = s.beta2 * load_moment(*v) + (1.0f - s.beta2) * g * g;
  store_moment(m, m_new, bits);
  store_moment(v, v_new, bits >> 16 | bits << 16);
  const float denom = std::sqrt(v_new) * s.inv_sqrt_bc2 + s.eps;
  p = p * decay - s.step_size * (m_new / denom);
}

// One element of SGD; buf is null without momentum. wd is this tensor's weight decay (coupled, as in
// PyTorch's SGD).
template <typename M>
MICROLLM_HD inline void sgd_element(float& p, float g, M* buf, float wd, const SgdScalars& s, uint32_t bits) {
  float d = g + wd * p;
  if (buf) {
    const float b = s.first_step ? d : s.momentum * load_moment(*buf) + (1.0f - s.dampening) * d;
    store_moment(buf, b, bits);
    d = s.nesterov ? d + s.momentum * b : b;
  }
  p = p - s.lr * d;
}

}  // namespace microllm::optim_math
