// Learning-rate schedules: warmup, cosine / linear / constant decay, the end points.
#include "microllm/train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "microllm/core/error.h"

namespace microllm::train {
namespace {

TEST(Schedule, WarmupThenCosineToMinRatio) {
  LrSchedule s{.lr = 1.0, .warmup_steps = 4, .total_steps = 14, .decay = DecayKind::cosine, .min_ratio = 0.1};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);     // decay starts after the warmup
  EXPECT_NEAR(s.at(13), 0.1, 1e-12);  // the last step reaches the floor
  EXPECT_NEAR(s.at(100), 0.1, 1e-12);
  EXPECT_NEAR(s.at(4 + 9.0 / 2), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 4.0 / 9)), 1e-12);
  for (int64_t t = 4; t < 13; ++t) EXPECT_GE(s.at(t), s.at(t + 1));
}

TEST(Schedule, LinearAndConstant) {
  LrSchedule linear{.lr = 2.0, .warmup_steps = 0, .total_steps = 11, .decay = DecayKind::linear, .min_ratio = 0.0};
  EXPECT_DOUBLE_EQ(linear.at(0), 2.0);
  EXPECT_DOUBLE_EQ(linear.at(5), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(10), 0.0);
  LrSchedule constant{.lr = 0.5, .warmup_steps = 2, .total_steps = 10, .decay = DecayKind::constant};
  EXPECT_DOUBLE_EQ(constant.at(0), 0.25);
  EXPECT_DOUBLE_EQ(constant.at(9), 0.5);
  EXPECT_EQ(parse_decay("linear"), DecayKind::linear);
  EXPECT_THROW(parse_decay("exponential"), ValueError);
  EXPECT_THROW((LrSchedule{.min_ratio = 2}.validate()), ValueError);
}

}  // namespace
}  // namespace microllm::train
