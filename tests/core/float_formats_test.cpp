// Narrow float formats against the rules written in float_formats.h: exhaustive decode/encode round trips
// over every bit pattern, and round-to-nearest-even checked by brute force against the table of decoded
// values (and, for bf16's bit trick, against the generic detail::round_magnitude).
#include "microllm/core/float_formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace microllm {
namespace {

using detail::bits_float;
using detail::float_bits;

// One format seen through plain functions of bit patterns, so one brute-force checker serves all four.
struct Format {
  const char* name;
  int bits;             // 8 or 16
  uint32_t max_finite;  // magnitude bits of the largest finite value
  uint32_t overflow;    // magnitude bits a value that rounds past max_finite becomes (Inf, or NaN for e4m3fn)
  int nan_patterns;     // exponent all ones with a nonzero mantissa; for e4m3fn only S.1111.111
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

float decode_f16(uint32_t b) { return to_float(f16{static_cast<uint16_t>(b)}); }
float decode_bf16(uint32_t b) { return to_float(bf16{static_cast<uint16_t>(b)}); }
float decode_e4m3(uint32_t b) { return to_float(f8_e4m3fn{static_cast<uint8_t>(b)}); }
float decode_e5m2(uint32_t b) { return to_float(f8_e5m2{static_cast<uint8_t>(b)}); }
uint32_t encode_f16(float f) { return f16_from_float(f).bits; }
uint32_t encode_bf16(float f) { return bf16_from_float(f).bits; }
uint32_t encode_e4m3(float f) { return f8_e4m3fn_from_float(f).bits; }
uint32_t encode_e5m2(float f) { return f8_e5m2_from_float(f).bits; }

const Format kF16{"f16", 16, 0x7bff, 0x7c00, 2 * 1023, decode_f16, encode_f16};
const Format kBf16{"bf16", 16, 0x7f7f, 0x7f80, 2 * 127, decode_bf16, encode_bf16};
const Format kE4m3{"e4m3fn", 8, 0x7e, 0x7f, 2, decode_e4m3, encode_e4m3};
const Format kE5m2{"e5m2", 8, 0x7b, 0x7c, 2 * 3, decode_e5m2, encode_e5m2};
const Format kFormats[] = {kF16, kBf16, kE4m3, kE5m2};

uint32_t sign_bit(const Format& f) { return 1u << (f.bits - 1); }

// The non-negative finite values of a format indexed by magnitude bits, plus one "virtual" value past
// the largest (max + one ulp of the top binade), which a value rounds to when it overflows.
std::vector<double> magnitude_table(const Format& f) {
  std::vector<double> table;
  for (uint32_t b = 0; b <= f.max_finite; ++b) table.push_back(f.decode(b));
  table.push_back(2 * table[f.max_finite] - table[f.max_finite - 1]);
  return table;
}

// The bits the rules require for x (finite), found by brute force over the table.
uint32_t expected_bits(const Format& f, const std::vector<double>& table, float x) {
  const uint32_t sign = std::signbit(x) ? sign_bit(f) : 0u;
  const double a = std::fabs(static_cast<double>(x));
  // First entry > a; the neighbours are lo = hi - 1 and hi.
  auto it = std::upper_bound(table.begin(), table.end(), a);
  uint32_t result;
  if (it == table.end()) {
    result = f.overflow;  // beyond even the virtual value
  } else {
    const auto hi = static_cast<uint32_t>(it - table.begin());
    const uint32_t lo = hi - 1;                      // hi >= 1 because table[0] == 0 <= a
    const double mid = (table[lo] + table[hi]) / 2;  // exact: both have few significant bits
    if (a < mid)
      result = lo;
    else if (a > mid)
      result = hi;
    else
      result = (lo & 1u) ? hi : lo;  // tie: the even mantissa
    if (result > f.max_finite) result = f.overflow;
  }
  return sign | result;
}

bool is_nan_pattern(const Format& f, uint32_t bits) { return std::isnan(f.decode(bits)); }

// Random f32 values that stress a format: uniformly random bit patterns (every exponent, subnormals),
// values inside the format's range, exact ties between neighbours and their f32 neighbours.
std::vector<float> stress_values(const Format& f, const std::vector<double>& table, uint64_t seed, int random_count) {
  std::mt19937_64 rng(seed);
  std::vector<float> values;
  for (int i = 0; i < random_count; ++i) {
    const float x = bits_float(static_cast<uint32_t>(rng()));
    if (std::isfinite(x)) values.push_back(x);
  }
  // Inside the format's range: a random f32 mantissa between two random table entries' binades.
  std::uniform_int_distribution<size_t> pick(0, table.size() - 1);
  for (int i = 0; i < random_count; ++i) {
    const double lo = table[pick(rng)];
    const double hi = table[pick(rng)];
    const double t = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto x = static_cast<float>(lo + (hi - lo) * t);
    values.push_back((rng() & 1) ? x : -x);
  }
  // Every tie between neighbours (including max and the virtual value past it) and its f32 neighbours.
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const auto mid = static_cast<float>((table[i] + table[i + 1]) / 2);
    EXPECT_EQ(static_cast<double>(mid), (table[i] + table[i + 1]) / 2) << f.name << ": tie not exact in f32";
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  // Around the largest finite value and the smallest subnormal.
  const auto max = static_cast<float>(table[f.max_finite]);
  for (float x : {max, std::nextafter(max, INFINITY), std::nextafter(max, 0.0f), max * 2, max * 1e10f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), static_cast<float>(table[1]), static_cast<float>(table[1] / 2),
                  static_cast<float>(table[1] / 4), static_cast<float>(table[1] * 0.75), 0.0f}) {
    values.push_back(x);
    values.push_back(-x);
  }
  return values;
}

TEST(FloatFormats, DecodeThenEncodeReturnsTheSameBitsForEveryPattern) {
  for (const Format& f : kFormats) {
    const uint32_t count = 1u << f.bits;
    int nan_patterns = 0;
    for (uint32_t b = 0; b < count; ++b) {
      const float x = f.decode(b);
      const uint32_t back = f.encode(x);
      if (std::isnan(x)) {
        ++nan_patterns;
        EXPECT_TRUE(is_nan_pattern(f, back)) << f.name << " NaN pattern " << b << " came back as " << back;
        EXPECT_EQ(back & sign_bit(f), b & sign_bit(f)) << f.name << ": NaN sign lost for pattern " << b;
        if (::testing::Test::HasFailure()) return;
        continue;
      }
      ASSERT_EQ(back, b) << f.name << " pattern " << b << " decodes to " << x;
    }
    EXPECT_EQ(nan_patterns, f.nan_patterns) << f.name;
  }
}

TEST(FloatFormats, DecodedValuesAreOrderedAndSignSymmetric) {
  for (const Format& f : kFormats) {
    double previous = -1;
    for (uint32_t b = 0; b <= f.max_finite; ++b) {
      const double v = f.decode(b);
      EXPECT_GT(v, previous) << f.name << " pattern " << b;
      const float negative = f.decode(b | sign_bit(f));
      EXPECT_EQ(static_cast<double>(negative), -v) << f.name << " pattern " << b;
      EXPECT_TRUE(std::signbit(negative)) << f.name << " pattern " << b;
      previous = v;
    }
  }
}

TEST(FloatFormats, SaturatingE4m3RoundTripsEveryFinitePattern) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float x = to_float(f8_e4m3fn{static_cast<uint8_t>(b)});
    const uint32_t back = f8_e4m3fn_from_float_saturate(x).bits;
    if (std::isnan(x))
      EXPECT_EQ(back & 0x7fu, 0x7fu);
    else
      EXPECT_EQ(back, b);
  }
}

// One test per format keeps each well under a second.
class RoundToNearestEven : public ::testing::TestWithParam<Format> {};

TEST_P(RoundToNearestEven, MatchesBruteForceOverTheDecodedTable) {
  const Format& f = GetParam();
  const std::vector<double> table = magnitude_table(f);
  const uint64_t seed = std::random_device{}();
  const std::vector<float> values = stress_values(f, table, seed, 150000);
  int failures = 0;
  for (float x : values) {
    const uint32_t want = expected_bits(f, table, x);
    const uint32_t got = f.encode(x);
    const bool both_nan = is_nan_pattern(f, want) && is_nan_pattern(f, got);
    if (got != want && !both_nan) {
      ADD_FAILURE() << f.name << ": " << x << " (f32 bits 0x" << std::hex << float_bits(x) << ") encodes to 0x" << got
                    << ", nearest-even is 0x" << want << std::dec << " (seed " << seed << ")";
      if (++failures > 10) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, RoundToNearestEven, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<Format>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(FloatFormats, GenericRoundMagnitudeMatchesTheTable) {
  // detail::round_magnitude on its own, for the formats whose encoders use it.
  const struct {
    Format format;
    detail::NarrowFormat narrow;
  } cases[] = {{kF16, detail::f16_format()},
               {kE4m3, detail::e4m3_format()},
               {kE5m2, detail::e5m2_format()},
               {kBf16, detail::bf16_format()}};
  for (const auto& c : cases) {
    const std::vector<double> table = magnitude_table(c.format);
    for (float x : stress_values(c.format, table, 1234, 20000)) {
      const uint32_t want = expected_bits(c.format, table, std::fabs(x));
      const uint32_t got = detail::round_magnitude(x, c.narrow);
      if (want == c.format.overflow) {
        EXPECT_GT(got, c.format.max_finite) << c.format.name << " " << x;
      } else {
        ASSERT_EQ(got, want) << c.format.name << " " << x;
      }
    }
  }
}

TEST(FloatFormats, Bf16FastPathMatchesGenericRounding) {
  std::mt19937_64 rng(std::random_device{}());
  auto generic = [](float x) {
    const uint32_t sign = (float_bits(x) >> 16) & 0x8000u;
    uint32_t magnitude = detail::round_magnitude(x, detail::bf16_format());
    if (magnitude > 0x7f7fu) magnitude = 0x7f80u;
    return sign | magnitude;
  };
  auto check = [&](float x) {
    if (!std::isfinite(x)) return;
    ASSERT_EQ(static_cast<uint32_t>(bf16_from_float(x).bits), generic(x))
        << x << " bits 0x" << std::hex << float_bits(x);
  };
  for (int i = 0; i < 500000; ++i) check(bits_float(static_cast<uint32_t>(rng())));
  // Every tie and its neighbours, with both signs: the low 16 bits 0x8000 and 0x7fff/0x8001.
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) check(bits_float((hi << 16) | lo));
  }
}

TEST(FloatFormats, KnownValues) {
  // e4m3fn: largest finite 448; the tie at 464 goes to 448 (even mantissa); past it NaN.
  EXPECT_EQ(f8_e4m3fn_from_float(448.0f).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float(-448.0f).bits, 0xfe);
  EXPECT_EQ(f8_e4m3fn_from_float(464.0f).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float(std::nextafter(464.0f, 0.0f)).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float(std::nextafter(464.0f, 1000.0f)).bits & 0x7f, 0x7f);
  EXPECT_EQ(f8_e4m3fn_from_float(480.0f).bits & 0x7f, 0x7f);
  EXPECT_EQ(f8_e4m3fn_from_float(1e30f).bits & 0x7f, 0x7f);
  EXPECT_EQ(f8_e4m3fn_from_float(INFINITY).bits & 0x7f, 0x7f);
  EXPECT_EQ(f8_e4m3fn_from_float(-INFINITY).bits & 0x7f, 0x7f);
  EXPECT_TRUE(std::isnan(to_float(f8_e4m3fn{0x7f})));
  EXPECT_TRUE(std::isnan(to_float(f8_e4m3fn{0xff})));
  EXPECT_EQ(to_float(f8_e4m3fn{0x78}), 256.0f);  // exponent all ones is finite in e4m3fn
  EXPECT_EQ(to_float(f8_e4m3fn{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(f8_e4m3fn{0x08}), std::ldexp(1.0f, -6));
  EXPECT_EQ(f8_e4m3fn_from_float(1.0f).bits, 0x38);
  EXPECT_EQ(f8_e4m3fn_from_float(std::ldexp(1.0f, -10)).bits, 0x00);  // tie between 0 and the smallest: 0
  EXPECT_EQ(f8_e4m3fn_from_float(std::ldexp(3.0f, -11)).bits, 0x01);
  EXPECT_EQ(f8_e4m3fn_from_float(std::ldexp(3.0f, -10)).bits, 0x02);  // tie between 1 and 2 ulps: 2
  // Saturating variant: clamps to +-448, Inf too; NaN stays NaN.
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(480.0f).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(1e30f).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(-1e30f).bits, 0xfe);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(INFINITY).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(-INFINITY).bits, 0xfe);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(std::nanf("")).bits & 0x7f, 0x7f);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(464.0f).bits, 0x7e);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(1.0f).bits, 0x38);

  // f16: largest finite 65504; 65520 is the tie with 65536 and goes to Inf (65504 has an odd mantissa).
  EXPECT_EQ(f16_from_float(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_float(f16{0x7bff}), 65504.0f);
  EXPECT_EQ(f16_from_float(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(f16_from_float(65520.0f).bits, 0x7c00);
  EXPECT_EQ(f16_from_float(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(f16_from_float(1e10f).bits, 0x7c00);
  EXPECT_EQ(f16_from_float(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16_from_float(-2.0f).bits, 0xc000);
  EXPECT_EQ(f16_from_float(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie: even
  EXPECT_EQ(f16_from_float(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie: even
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -24)).bits, 0x0001);             // smallest subnormal
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -25)).bits, 0x0000);             // tie with 0
  EXPECT_EQ(f16_from_float(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -14)).bits, 0x0400);                          // smallest normal
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)).bits, 0x0400);  // carry into normal
  EXPECT_EQ(f16_from_float(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  EXPECT_EQ(f16_from_float(-std::numeric_limits<float>::denorm_min()).bits, 0x8000);

  // bf16: the top half of an f32, rounded.
  EXPECT_EQ(bf16_from_float(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_from_float(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(bf16_from_float(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bf16_from_float(-std::numeric_limits<float>::max()).bits, 0xff80);
  EXPECT_EQ(to_float(bf16{0x7f7f}), bits_float(0x7f7f0000u));
  EXPECT_EQ(bf16_from_float(bits_float(0x7f7f7fffu)).bits, 0x7f7f);
  EXPECT_EQ(bf16_from_float(bits_float(0x7f7f8000u)).bits, 0x7f80);  // tie past the max: Inf

  // e5m2: largest finite 57344; the tie at 61440 goes to Inf.
  EXPECT_EQ(f8_e5m2_from_float(57344.0f).bits, 0x7b);
  EXPECT_EQ(to_float(f8_e5m2{0x7b}), 57344.0f);
  EXPECT_EQ(f8_e5m2_from_float(std::nextafter(61440.0f, 0.0f)).bits, 0x7b);
  EXPECT_EQ(f8_e5m2_from_float(61440.0f).bits, 0x7c);
  EXPECT_EQ(f8_e5m2_from_float(-1e30f).bits, 0xfc);
  EXPECT_EQ(to_float(f8_e5m2{0x7c}), INFINITY);
  EXPECT_EQ(to_float(f8_e5m2{0xfc}), -INFINITY);
  EXPECT_EQ(f8_e5m2_from_float(std::ldexp(1.0f, -16)).bits, 0x01);
  EXPECT_EQ(f8_e5m2_from_float(1.0f).bits, 0x3c);
}

TEST(FloatFormats, InfNanAndSignedZero) {
  const float nan = std::nanf("");
  const float negative_nan = -std::nanf("");
  // Inf stays Inf where the format has it.
  EXPECT_EQ(f16_from_float(INFINITY).bits, 0x7c00);
  EXPECT_EQ(f16_from_float(-INFINITY).bits, 0xfc00);
  EXPECT_EQ(bf16_from_float(INFINITY).bits, 0x7f80);
  EXPECT_EQ(bf16_from_float(-INFINITY).bits, 0xff80);
  EXPECT_EQ(f8_e5m2_from_float(INFINITY).bits, 0x7c);
  EXPECT_EQ(f8_e5m2_from_float(-INFINITY).bits, 0xfc);
  EXPECT_EQ(to_float(f16{0x7c00}), INFINITY);
  EXPECT_EQ(to_float(bf16{0xff80}), -INFINITY);
  // NaN stays NaN, quiet, sign kept; every NaN payload (also ones that a bare truncation would lose).
  for (uint32_t payload : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7f802000u, 0x7fffffffu}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = bits_float(payload | sign);
      const bool negative = sign != 0;
      EXPECT_TRUE(std::isnan(to_float(f16_from_float(x))));
      EXPECT_TRUE(std::isnan(to_float(bf16_from_float(x)))) << std::hex << payload;
      EXPECT_TRUE(std::isnan(to_float(f8_e4m3fn_from_float(x))));
      EXPECT_TRUE(std::isnan(to_float(f8_e5m2_from_float(x))));
      EXPECT_EQ((f16_from_float(x).bits & 0x8000) != 0, negative);
      EXPECT_EQ((bf16_from_float(x).bits & 0x8000) != 0, negative);
      EXPECT_EQ((f8_e4m3fn_from_float(x).bits & 0x80) != 0, negative);
      EXPECT_EQ((f8_e5m2_from_float(x).bits & 0x80) != 0, negative);
      // Quiet: the top mantissa bit is set.
      EXPECT_NE(f16_from_float(x).bits & 0x0200, 0);
      EXPECT_NE(bf16_from_float(x).bits & 0x0040, 0);
    }
  }
  EXPECT_TRUE(std::signbit(to_float(f16_from_float(negative_nan))));
  EXPECT_FALSE(std::signbit(to_float(bf16_from_float(nan))));
  // Zero keeps its sign, and so does an underflow to zero.
  EXPECT_EQ(f16_from_float(-0.0f).bits, 0x8000);
  EXPECT_EQ(bf16_from_float(-0.0f).bits, 0x8000);
  EXPECT_EQ(f8_e4m3fn_from_float(-0.0f).bits, 0x80);
  EXPECT_EQ(f8_e5m2_from_float(-0.0f).bits, 0x80);
  EXPECT_EQ(f8_e4m3fn_from_float_saturate(-0.0f).bits, 0x80);
  EXPECT_EQ(f16_from_float(0.0f).bits, 0x0000);
  EXPECT_EQ(f16_from_float(-1e-30f).bits, 0x8000);
  EXPECT_EQ(bf16_from_float(-1e-45f).bits, 0x8000);
  EXPECT_EQ(f8_e4m3fn_from_float(-1e-10f).bits, 0x80);
  EXPECT_EQ(f8_e5m2_from_float(-1e-10f).bits, 0x80);
  EXPECT_TRUE(std::signbit(to_float(f16{0x8000})));
  EXPECT_TRUE(std::signbit(to_float(f8_e4m3fn{0x80})));
}

TEST(FloatFormats, GenericFromFloatDispatches) {
  EXPECT_EQ(from_float<f16>(1.5f).bits, f16_from_float(1.5f).bits);
  EXPECT_EQ(from_float<bf16>(1.5f).bits, bf16_from_float(1.5f).bits);
  EXPECT_EQ(from_float<f8_e4m3fn>(500.0f).bits, f8_e4m3fn_from_float(500.0f).bits);
  EXPECT_EQ(from_float<f8_e5m2>(1.5f).bits, f8_e5m2_from_float(1.5f).bits);
  EXPECT_EQ(from_float<double>(1.5f), 1.5);
  EXPECT_EQ(from_float<float>(-2.25f), -2.25f);
}

}  // namespace
}  // namespace microllm
