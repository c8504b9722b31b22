// Rotary position embedding: checks, positions broadcast, dispatch; the backward is the inverse rotation.
#include "microllm/ops/rope.h"

#include <cmath>

#include "checks.h"
#include "microllm/backend/rope_math.h"

namespace microllm {
namespace {

bool positive_finite(double v) { return std::isfinite(v) && v > 0; }

void check_params(const char* op, const RopeParams& params, int64_t head_dim) {
  MICROLLM_CHECK(positive_finite(params.theta), ValueError, op, "theta must be a finite number > 0, got ",
                 params.theta);
  const RopeScaling& s = params.scaling;
  if (s.type == RopeScalingType::none) return;
  MICROLLM_CHECK(positive_finite(s.factor), ValueError, op, "rope scaling factor must be a finite number > 0, got ",
                 s.factor);
  if (s.type == RopeScalingType::linear) return;
  MICROLLM_CHECK(s.original_max_position_embeddings > 0, ValueError, op,
                 "rope scaling original_max_position_embeddings must be > 0, got ", s.original_max_position_embeddings);
  if (s.type == RopeScalingType::llama3) {
    MICROLLM_CHECK(positive_finite(s.low_freq_factor) && positive_finite(s.high_freq_factor), ValueError, op,
                   "llama3 low_freq_factor and high_freq_factor must be finite numbers > 0, got ", s.low_freq_factor,
                   " and ", s.high_freq_factor);
    // The blend divides by their difference.
    MICROLLM_CHECK(s.high_freq_factor != s.low_freq_factor, ValueError, op,
                   "llama3 high_freq_factor must differ from low_freq_factor, both are ", s.low_freq_factor);
  } else if (s.type == RopeScalingType::yarn) {
    MICROLLM_CHECK(positive_finite(s.beta_fast) && positive_finite(s.beta_slow), ValueError, op,
                   "yarn beta_fast and beta_slow must be finite numbers > 0, got ", s.beta_fast, " and ", s.beta_slow);
  } else if (s.type == RopeScalingType::longrope) {
    MICROLLM_CHECK(static_cast<int64_t>(s.frequency_factors.size()) == head_dim / 2, ValueError, op,
                   "longrope needs one factor per rotary pair (", head_dim / 2, " for head dim ", head_dim, "), got ",
                   s.frequency_factors.size());
    for (double f : s.frequency_factors) {
      MICROLLM_CHECK(positive_finite(f), ValueError, op, "longrope factors must be finite numbers > 0, got ", f);
    }
  }
}

}  // namespace

// x [B, T, H, D], D even; positions [B, T] or [T], returned expanded to [B, T].
Tensor checks::rope_positions(const char* op, const Tensor& x, const char* x_name, const Tensor& positions,
                              const RopeParams& params) {
  checks::floating(op, x, x_name);
  MICROLLM_CHECK(x.dim() == 4, ShapeError, op, x_name, " must be [B, T, H, D], got shape ", x.shape());
  MICROLLM_CHECK(x.size(3) % 2 == 0, ShapeError, op, "head dim must be even, got ", x.size(3), " in ", x_name,
                 " shape ", x.shape());
  checks::index_dtype(op, positions, "positions");
  checks::same_device(op, x, x_name, positions, "positions");
  const int64_t batch = x.size(0), seq = x.size(1);
  const bool per_batch = positions.dim() == 2 && positions.size(0) == batch && positions.size(1) == seq;
  const bool shared = positions.dim() == 1 && positions.size(0) == seq;
  MICROLLM_CHECK(per_batch || shared, ShapeError, op, "positions shape ", positions.shape(), " must be [", batch, ", ",
                 seq, "] or [", seq, "] for ", x_name, " shape ", x.shape());
  check_params(op, params, x.size(3));
  return shared ? positions.unsqueeze(0).expand({batch, seq}) : positions;
}

namespace {

Tensor rotate(const char* op, const char* x_name, const Tensor& x, const Tensor& positions, const RopeParams& params,
              bool inverse) {
  const Tensor pos = checks::rope_positions(op, x, x_name, positions, params);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).rope(x, pos, params, inverse, out);
  return out;
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const RopeParams& params) {
  return rotate("rope", "input", x, positions, params, /*inverse=*/false);
}

// The rotation R is orthogonal, so d(R x) / dx applied to g is R^T g = R(-angle) g.
Tensor rope_backward(const Tensor& grad_out, const Tensor& positions, const RopeParams& params) {
  return rotate("rope_backward", "grad_out", grad_out, positions, params, /*inverse=*/true);
}

std::vector<float> rope_inv_freq(const RopeParams& params, int64_t head_dim) {
  MICROLLM_CHECK(head_dim > 0 && head_dim % 2 == 0, ValueError, "rope_inv_freq", "head_dim must be even and > 0, got ",
                 head_dim);
  check_params("rope_inv_freq", params, head_dim);
  return rope_inv_freq_as<float>(params, head_dim);
}

}  // namespace microllm
