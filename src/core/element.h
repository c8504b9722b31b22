// Element conversions shared by the CPU copy and the CPU kernels (internal header).
// Floats go through double (exact for every narrow format); integers through int64.
// Float -> integer truncates toward zero, saturates at the integer's range, and maps NaN to 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "microllm/core/dtype.h"

namespace microllm::detail {

template <typename T>
constexpr bool is_narrow_float_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                                   std::is_same_v<T, f8_e4m3fn> || std::is_same_v<T, f8_e5m2>;
template <typename T>
constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_narrow_float_v<T>;

// The accumulation type of a storage type: f64 for f64, f32 for everything else.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Floats load as their accumulation type, integers as int64.
template <typename T>
inline auto load(const T* p) {
  if constexpr (is_narrow_float_v<T>) return to_float(*p);
  else if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(*p);
  else return *p;
}

template <typename T, typename A>
inline void store(T* p, A value) {
  if constexpr (is_narrow_float_v<T>) *p = from_float<T>(static_cast<float>(value));
  else *p = static_cast<T>(value);
}

template <typename Dst, typename Src>
inline Dst convert_element(Src value) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return value;
  } else if constexpr (!is_float_like_v<Src> && !is_float_like_v<Dst>) {
    return static_cast<Dst>(static_cast<int64_t>(value));  // integer to integer wraps, as in C++ and torch
  } else {
    double v;
    if constexpr (is_narrow_float_v<Src>) v = to_float(value);
    else v = static_cast<double>(value);
    if constexpr (is_narrow_float_v<Dst>) {
      return from_float<Dst>(static_cast<float>(v));
    } else if constexpr (std::is_floating_point_v<Dst>) {
      return static_cast<Dst>(v);
    } else {
      if (std::isnan(v)) return Dst{0};
      constexpr double lo = static_cast<double>(std::numeric_limits<Dst>::lowest());
      constexpr double hi = static_cast<double>(std::numeric_limits<Dst>::max());
      if (v <= lo) return std::numeric_limits<Dst>::lowest();
      if (v >= hi) return std::numeric_limits<Dst>::max();
      return static_cast<Dst>(v);
    }
  }
}

// Calls fn.template operator()<T>() with T the storage type of `dtype` (all dtypes).
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
#define MICROLLM_VISIT_CASE(name, type, str) \
  case DType::name:                          \
    return fn.template operator()<type>();
    MICROLLM_DTYPES(MICROLLM_VISIT_CASE)
#undef MICROLLM_VISIT_CASE
  }
  return fn.template operator()<float>();  // unreachable: every enum value has a case
}

}  // namespace microllm::detail
