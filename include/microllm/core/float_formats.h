// Narrow floating-point formats and their conversions to and from f32.
//
// Rules (tested exhaustively in tests/core/float_formats_test.cpp, and they match PyTorch's `.to()`):
// - Every conversion from f32 rounds to nearest, ties to even, subnormals included.
// - f16, bf16: a finite value that rounds past the largest finite value becomes +-Inf; Inf stays Inf;
//   NaN stays NaN (quiet, sign kept).
// - fp8 e5m2 (IEEE-like, has Inf): same rules as f16; largest finite 57344.
// - fp8 e4m3fn ("fn" = finite, no Inf): largest finite 448; 0x7F / 0xFF are NaN. A value that rounds
//   past 448, and +-Inf, become NaN (PyTorch's non-saturating rule). `f8_e4m3fn_from_float_saturate`
//   clamps to +-448 instead (Inf too; NaN stays NaN), the rule scaled FP8 training wants.
#pragma once

#include <cstdint>
#include <cstring>

// These conversions also compile into CUDA kernels (the GPU casts use the very same rounding code).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MICROLLM_FORMAT_HD __host__ __device__
#else
#define MICROLLM_FORMAT_HD
#endif

namespace microllm {

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };
struct f8_e4m3fn { uint8_t bits; };
struct f8_e5m2 { uint8_t bits; };

namespace detail {

MICROLLM_FORMAT_HD inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
MICROLLM_FORMAT_HD inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// A binary format with `exp_bits` exponent bits and `man_bits` stored mantissa bits.
struct NarrowFormat {
  int exp_bits;
  int man_bits;
  int bias;
};

// Rounds |x| (finite, non-NaN) to the nearest value of `fmt` (ties to even) and returns its magnitude
// bits, exponent and mantissa fields together. Results past the format's largest exponent field are
// returned as they fall; the caller applies its overflow rule.
MICROLLM_FORMAT_HD inline uint32_t round_magnitude(float x, NarrowFormat fmt) {
  const uint32_t u = float_bits(x) & 0x7fffffffu;
  if (u == 0) return 0;
  int exponent = static_cast<int>(u >> 23) - 127;
  uint32_t significand = u & 0x7fffffu;  // 23 fraction bits
  if ((u >> 23) == 0) {
    exponent = -126;  // f32 subnormal: no implicit leading one
  } else {
    significand |= 0x800000u;
  }
  const int min_normal_exponent = 1 - fmt.bias;
  int shift = 23 - fmt.man_bits;
  if (exponent < min_normal_exponent) shift += min_normal_exponent - exponent;
  if (shift > 31) return 0;  // far below half the smallest subnormal
  uint32_t rounded = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t half = shift > 0 ? 1u << (shift - 1) : 0u;
  if (shift > 0 && (remainder > half || (remainder == half && (rounded & 1u)))) ++rounded;
  if (exponent < min_normal_exponent) return rounded;  // subnormal; a carry lands in exponent field 1
  // Normal: a mantissa carry (rounded == 2^(man_bits+1)) correctly bumps the exponent field.
  return (static_cast<uint32_t>(exponent + fmt.bias) << fmt.man_bits) + (rounded - (1u << fmt.man_bits));
}

MICROLLM_FORMAT_HD inline float decode_magnitude(uint32_t magnitude_bits, NarrowFormat fmt) {
  const uint32_t exp_field = magnitude_bits >> fmt.man_bits;
  const uint32_t mantissa = magnitude_bits & ((1u << fmt.man_bits) - 1u);
  // Built from exact f32 arithmetic: every narrow value is representable in f32.
  float scale = 1.0f;
  int e = (exp_field == 0 ? 1 : static_cast<int>(exp_field)) - fmt.bias - fmt.man_bits;
  for (; e > 0; --e) scale *= 2.0f;
  for (; e < 0; ++e) scale *= 0.5f;
  const uint32_t integer = exp_field == 0 ? mantissa : (mantissa | (1u << fmt.man_bits));
  return static_cast<float>(integer) * scale;
}

MICROLLM_FORMAT_HD constexpr NarrowFormat f16_format() { return {5, 10, 15}; }
MICROLLM_FORMAT_HD constexpr NarrowFormat bf16_format() { return {8, 7, 127}; }
MICROLLM_FORMAT_HD constexpr NarrowFormat e4m3_format() { return {4, 3, 7}; }
MICROLLM_FORMAT_HD constexpr NarrowFormat e5m2_format() { return {5, 2, 15}; }

MICROLLM_FORMAT_HD inline bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
MICROLLM_FORMAT_HD inline bool is_inf_bits(uint32_t u) { return (u & 0x7fffffffu) == 0x7f800000u; }

}  // namespace detail

// ---- bf16: the fast bit trick, tested against the generic rounding above ----
MICROLLM_FORMAT_HD inline float to_float(bf16 v) { return detail::bits_float(static_cast<uint32_t>(v.bits) << 16); }
MICROLLM_FORMAT_HD inline bf16 bf16_from_float(float f) {
  const uint32_t u = detail::float_bits(f);
  if (detail::is_nan_bits(u)) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};  // a carry into the exponent gives Inf
}

// ---- f16 ----
MICROLLM_FORMAT_HD inline float to_float(f16 v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t magnitude = v.bits & 0x7fffu;
  if ((magnitude >> 10) == 0x1f) {
    return detail::bits_float(sign | 0x7f800000u | (static_cast<uint32_t>(magnitude & 0x3ffu) << 13));
  }
  const float value = detail::decode_magnitude(magnitude, detail::f16_format());
  return sign ? -value : value;
}
MICROLLM_FORMAT_HD inline f16 f16_from_float(float f) {
  const uint32_t u = detail::float_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (detail::is_nan_bits(u)) return f16{static_cast<uint16_t>(sign | 0x7e00u)};
  if (detail::is_inf_bits(u)) return f16{static_cast<uint16_t>(sign | 0x7c00u)};
  uint32_t magnitude = detail::round_magnitude(f, detail::f16_format());
  if (magnitude > 0x7bffu) magnitude = 0x7c00u;  // rounded past 65504: Inf
  return f16{static_cast<uint16_t>(sign | magnitude)};
}

// ---- fp8 e4m3fn ----
MICROLLM_FORMAT_HD inline float to_float(f8_e4m3fn v) {
  const uint32_t magnitude = v.bits & 0x7fu;
  const bool negative = (v.bits & 0x80u) != 0;
  if (magnitude == 0x7fu) return detail::bits_float((negative ? 0x80000000u : 0u) | 0x7fc00000u);
  const float value = detail::decode_magnitude(magnitude, detail::e4m3_format());
  return negative ? -value : value;
}
MICROLLM_FORMAT_HD inline f8_e4m3fn f8_e4m3fn_from_float(float f) {
  const uint32_t u = detail::float_bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (detail::is_nan_bits(u) || detail::is_inf_bits(u)) return f8_e4m3fn{static_cast<uint8_t>(sign | 0x7fu)};
  uint32_t magnitude = detail::round_magnitude(f, detail::e4m3_format());
  if (magnitude > 0x7eu) magnitude = 0x7fu;  // rounded past 448: NaN
  return f8_e4m3fn{static_cast<uint8_t>(sign | magnitude)};
}
MICROLLM_FORMAT_HD inline f8_e4m3fn f8_e4m3fn_from_float_saturate(float f) {
  const uint32_t u = detail::float_bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (detail::is_nan_bits(u)) return f8_e4m3fn{static_cast<uint8_t>(sign | 0x7fu)};
  if (detail::is_inf_bits(u)) return f8_e4m3fn{static_cast<uint8_t>(sign | 0x7eu)};
  uint32_t magnitude = detail::round_magnitude(f, detail::e4m3_format());
  if (magnitude > 0x7eu) magnitude = 0x7eu;
  return f8_e4m3fn{static_cast<uint8_t>(sign | magnitude)};
}

// ---- fp8 e5m2 ----
MICROLLM_FORMAT_HD inline float to_float(f8_e5m2 v) {
  // e5m2 is the top byte of an f16.
  return to_float(f16{static_cast<uint16_t>(static_cast<uint16_t>(v.bits) << 8)});
}
MICROLLM_FORMAT_HD inline f8_e5m2 f8_e5m2_from_float(float f) {
  const uint32_t u = detail::float_bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (detail::is_nan_bits(u)) return f8_e5m2{static_cast<uint8_t>(sign | 0x7fu)};
  if (detail::is_inf_bits(u)) return f8_e5m2{static_cast<uint8_t>(sign | 0x7cu)};
  uint32_t magnitude = detail::round_magnitude(f, detail::e5m2_format());
  if (magnitude > 0x7bu) magnitude = 0x7cu;  // rounded past 57344: Inf
  return f8_e5m2{static_cast<uint8_t>(sign | magnitude)};
}

// Generic conversion used by templated kernels: `convert<T>(float)` and `to_float(T)` for every type.
template <typename T> MICROLLM_FORMAT_HD inline T from_float(float f) { return static_cast<T>(f); }
template <> MICROLLM_FORMAT_HD inline bf16 from_float<bf16>(float f) { return bf16_from_float(f); }
template <> MICROLLM_FORMAT_HD inline f16 from_float<f16>(float f) { return f16_from_float(f); }
template <> MICROLLM_FORMAT_HD inline f8_e4m3fn from_float<f8_e4m3fn>(float f) { return f8_e4m3fn_from_float(f); }
template <> MICROLLM_FORMAT_HD inline f8_e5m2 from_float<f8_e5m2>(float f) { return f8_e5m2_from_float(f); }

}  // namespace microllm
