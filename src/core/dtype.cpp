#include "microllm/core/dtype.h"

#include <ostream>
#include <string>

#include "microllm/core/error.h"

namespace microllm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
#define MICROLLM_SIZE_CASE(name, type, str) \
  case DType::name:                         \
    return sizeof(type);
    MICROLLM_DTYPES(MICROLLM_SIZE_CASE)
#undef MICROLLM_SIZE_CASE
  }
  throw ValueError("dtype", str_cat("unknown dtype value ", static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
#define MICROLLM_NAME_CASE(name, type, str) \
  case DType::name:                         \
    return str;
    MICROLLM_DTYPES(MICROLLM_NAME_CASE)
#undef MICROLLM_NAME_CASE
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
#define MICROLLM_PARSE_CASE(enum_name, type, str) \
  if (name == str) return DType::enum_name;
  MICROLLM_DTYPES(MICROLLM_PARSE_CASE)
#undef MICROLLM_PARSE_CASE
  // The spellings of PyTorch, safetensors and config.json files.
  if (name == "float32" || name == "float" || name == "F32") return DType::f32;
  if (name == "float16" || name == "half" || name == "F16") return DType::f16;
  if (name == "bfloat16" || name == "BF16") return DType::bf16;
  if (name == "float64" || name == "double" || name == "F64") return DType::f64;
  if (name == "int8" || name == "I8") return DType::i8;
  if (name == "uint8" || name == "U8") return DType::u8;
  if (name == "int32" || name == "I32") return DType::i32;
  if (name == "int64" || name == "I64") return DType::i64;
  if (name == "float8_e4m3fn" || name == "F8_E4M3") return DType::f8_e4m3fn;
  if (name == "float8_e5m2" || name == "F8_E5M2") return DType::f8_e5m2;
  throw ValueError("dtype", str_cat("unknown dtype name '", name, "'"));
}

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::f32: case DType::f16: case DType::bf16: case DType::f64:
    case DType::f8_e4m3fn: case DType::f8_e5m2:
      return true;
    default:
      return false;
  }
}

bool is_integral(DType dtype) { return !is_floating(dtype); }

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

}  // namespace microllm
