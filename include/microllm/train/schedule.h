// Learning-rate schedules: linear warmup, then cosine, linear or constant decay to min_ratio * lr.
#pragma once

#include <cstdint>
#include <string>

namespace microllm::train {

enum class DecayKind { cosine, linear, constant };

DecayKind parse_decay(const std::string& name);  // "cosine", "linear", "constant"; throws ValueError
const char* decay_name(DecayKind kind);

struct LrSchedule {
  double lr = 1e-3;          // the peak
  int64_t warmup_steps = 0;  // lr rises linearly over these steps: lr * (step + 1) / warmup_steps
  int64_t total_steps = 1;   // the decay reaches lr * min_ratio at the last step
  DecayKind decay = DecayKind::cosine;
  double min_ratio = 0.1;

  // The learning rate of optimizer step `step` (0-based). Steps past total_steps keep the final value.
  double at(int64_t step) const;
  void validate() const;  // throws ValueError naming the field
};

}  // namespace microllm::train
