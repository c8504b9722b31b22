#include "microllm/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "microllm/core/error.h"

namespace microllm::train {

DecayKind parse_decay(const std::string& name) {
  if (name == "cosine") return DecayKind::cosine;
  if (name == "linear") return DecayKind::linear;
  if (name == "constant") return DecayKind::constant;
  throw ValueError("schedule", str_cat("unknown decay '", name, "' (have cosine, linear, constant)"));
}

const char* decay_name(DecayKind kind) {
  switch (kind) {
    case DecayKind::cosine: return "cosine";
    case DecayKind::linear: return "linear";
    case DecayKind::constant: return "constant";
  }
  return "?";
}

void LrSchedule::validate() const {
  MICROLLM_CHECK(lr >= 0 && std::isfinite(lr), ValueError, "schedule", "lr must be >= 0, got ", lr);
  MICROLLM_CHECK(warmup_steps >= 0, ValueError, "schedule", "warmup_steps must be >= 0, got ", warmup_steps);
  MICROLLM_CHECK(total_steps >= 1, ValueError, "schedule", "total_steps must be >= 1, got ", total_steps);
  MICROLLM_CHECK(min_ratio >= 0 && min_ratio <= 1, ValueError, "schedule", "min_ratio must be in [0, 1], got ",
                 min_ratio);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  // Decay over [warmup, total - 1]: progress 0 at the first step after warmup, 1 at the last step.
  const int64_t span = std::max<int64_t>(1, total_steps - 1 - warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  double factor = 1;
  switch (decay) {
    case DecayKind::cosine:
      factor = min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
      break;
    case DecayKind::linear: factor = 1 - (1 - min_ratio) * progress; break;
    case DecayKind::constant: factor = 1; break;
  }
  return lr * factor;
}

}  // namespace microllm::train
