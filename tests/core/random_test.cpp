// Philox4x32-10 against the Random123 known-answer vectors, and the Generator built on it: determinism,
// counters, ranges, and next_below without modulo bias.
#include "microllm/core/random.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace microllm {
namespace {

using Words = std::array<uint32_t, 4>;

// Random123 counts with four 32-bit words c0..c3 and a key of two words k0, k1; philox4x32 packs them as
// counter_lo = c1:c0, counter_hi = c3:c2, key = k1:k0.
Words philox_words(Words counter, std::array<uint32_t, 2> key) {
  const uint64_t lo = (static_cast<uint64_t>(counter[1]) << 32) | counter[0];
  const uint64_t hi = (static_cast<uint64_t>(counter[3]) << 32) | counter[2];
  const uint64_t k = (static_cast<uint64_t>(key[1]) << 32) | key[0];
  return philox4x32(k, hi, lo);
}

TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(philox_words({0, 0, 0, 0}, {0, 0}), (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox_words({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox_words({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, EveryInputWordMatters) {
  const Words base = philox4x32(7, 11, 13);
  EXPECT_EQ(philox4x32(7, 11, 13), base);
  EXPECT_NE(philox4x32(7 + (uint64_t{1} << 32), 11, 13), base);
  EXPECT_NE(philox4x32(8, 11, 13), base);
  EXPECT_NE(philox4x32(7, 11 + (uint64_t{1} << 32), 13), base);
  EXPECT_NE(philox4x32(7, 12, 13), base);
  EXPECT_NE(philox4x32(7, 11, 13 + (uint64_t{1} << 32)), base);
  EXPECT_NE(philox4x32(7, 11, 14), base);
}

TEST(Generator, CountsBlocksAndIsDeterministic) {
  Generator a(42), b(42), c(43);
  EXPECT_EQ(a.seed(), 42u);
  EXPECT_EQ(a.offset(), 0u);
  std::vector<uint32_t> from_a, from_b, from_c;
  for (int i = 0; i < 16; ++i) {
    from_a.push_back(a.next_u32());
    from_b.push_back(b.next_u32());
    from_c.push_back(c.next_u32());
  }
  EXPECT_EQ(from_a, from_b);
  EXPECT_NE(from_a, from_c);
  EXPECT_EQ(a.offset(), 16u);  // one block per single draw
  // A draw is the first word of block `offset` under key `seed`.
  Generator d(42);
  EXPECT_EQ(d.next_u32(), philox4x32(42, 0, 0)[0]);
  EXPECT_EQ(d.next_u64(), (static_cast<uint64_t>(philox4x32(42, 0, 1)[0]) << 32) | philox4x32(42, 0, 1)[1]);
  // reserve hands out consecutive counters.
  EXPECT_EQ(d.reserve(10), 2u);
  EXPECT_EQ(d.reserve(1), 12u);
  EXPECT_EQ(d.offset(), 13u);
  // set_state replays.
  Generator e(1);
  e.set_state(42, 3);
  Generator f(42);
  f.reserve(3);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(e.next_u64(), f.next_u64());
}

TEST(Generator, UniformDrawsStayInRange) {
  Generator gen(7);
  double total = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double u = gen.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    total += u;
  }
  EXPECT_NEAR(total / n, 0.5, 0.02);
  EXPECT_EQ(uniform_from_bits(0), 0.0f);
  EXPECT_LT(uniform_from_bits(0xffffffffu), 1.0f);
  EXPECT_EQ(uniform_from_bits(0x80000000u), 0.5f);
}

TEST(Generator, NextBelowIsInRangeAndUnbiased) {
  Generator gen(123);
  EXPECT_EQ(gen.next_below(0), 0u);
  EXPECT_EQ(gen.next_below(1), 0u);
  // Chi-square over 7 buckets.
  const int n = 70000;
  std::array<int, 7> counts{};
  for (int i = 0; i < n; ++i) {
    const uint64_t v = gen.next_below(7);
    ASSERT_LT(v, 7u);
    ++counts[v];
  }
  double chi2 = 0;
  for (int c : counts) chi2 += (c - n / 7.0) * (c - n / 7.0) / (n / 7.0);
  EXPECT_LT(chi2, 30.0);  // 6 degrees of freedom: p < 1e-4
  // A bound of 3 * 2^62: plain `u64 % bound` would put half the draws below 2^62 instead of a third.
  const uint64_t bound = uint64_t{3} << 62;
  int below = 0;
  const int m = 30000;
  for (int i = 0; i < m; ++i) {
    const uint64_t v = gen.next_below(bound);
    ASSERT_LT(v, bound);
    if (v < (uint64_t{1} << 62)) ++below;
  }
  EXPECT_NEAR(below / static_cast<double>(m), 1.0 / 3.0, 0.02);
  // A power of two and the largest bound.
  std::set<uint64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(gen.next_below(4));
  EXPECT_EQ(seen, (std::set<uint64_t>{0, 1, 2, 3}));
  for (int i = 0; i < 100; ++i) EXPECT_LT(gen.next_below(UINT64_MAX), UINT64_MAX);
}

TEST(Generator, BoxMullerGivesStandardNormals) {
  double sum = 0, sum_sq = 0;
  int n = 0;
  for (uint32_t i = 0; i < 20000; ++i) {
    const auto words = philox4x32(99, 0, i);
    float pair[2];
    box_muller(words[0], words[1], pair);
    for (float v : pair) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum_sq += static_cast<double>(v) * v;
      ++n;
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.03);
  // The extreme inputs stay finite (u1 is never 0).
  float pair[2];
  box_muller(0, 0, pair);
  EXPECT_TRUE(std::isfinite(pair[0]) && std::isfinite(pair[1]));
  box_muller(0xffffffffu, 0xffffffffu, pair);
  EXPECT_TRUE(std::isfinite(pair[0]) && std::isfinite(pair[1]));
}

}  // namespace
}  // namespace microllm
