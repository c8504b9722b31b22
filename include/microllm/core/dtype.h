// Element types. One list (MICROLLM_DTYPES) makes the enum, the names and the sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "microllm/core/float_formats.h"

namespace microllm {

// X(enum name, C++ storage type, printed name)
#define MICROLLM_DTYPES(X)            \
  X(f32, float, "f32")                \
  X(f16, ::microllm::f16, "f16")      \
  X(bf16, ::microllm::bf16, "bf16")   \
  X(f64, double, "f64")               \
  X(i8, int8_t, "i8")                 \
  X(u8, uint8_t, "u8")                \
  X(i32, int32_t, "i32")              \
  X(i64, int64_t, "i64")              \
  X(f8_e4m3fn, ::microllm::f8_e4m3fn, "f8e4m3fn") \
  X(f8_e5m2, ::microllm::f8_e5m2, "f8e5m2")

enum class DType : uint8_t {
#define MICROLLM_DTYPE_ENUM(name, type, str) name,
  MICROLLM_DTYPES(MICROLLM_DTYPE_ENUM)
#undef MICROLLM_DTYPE_ENUM
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "f32", "bf16", "float32", "bfloat16", "float16", "half", "f8e4m3fn", ...; throws ValueError.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);  // f32, f16, bf16, f64 and the fp8 types
bool is_integral(DType dtype);
std::ostream& operator<<(std::ostream& out, DType dtype);

// The C++ storage type of each DType, for templated kernels.
template <DType D> struct DTypeTraits;
#define MICROLLM_DTYPE_TRAITS(name, type, str) \
  template <> struct DTypeTraits<DType::name> { using Type = type; };
MICROLLM_DTYPES(MICROLLM_DTYPE_TRAITS)
#undef MICROLLM_DTYPE_TRAITS

template <typename T> constexpr DType dtype_of();
#define MICROLLM_DTYPE_OF(name, type, str) \
  template <> constexpr DType dtype_of<type>() { return DType::name; }
MICROLLM_DTYPES(MICROLLM_DTYPE_OF)
#undef MICROLLM_DTYPE_OF

}  // namespace microllm
