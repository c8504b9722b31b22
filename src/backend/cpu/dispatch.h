// dtype dispatch for CPU kernels (internal header).
#pragma once

#include "../../core/element.h"
#include "../../core/parallel.h"
#include "../../core/strided_loop.h"
#include "microllm/core/error.h"
#include "microllm/core/tensor.h"

namespace microllm::cpu {

using detail::acc_t;
using detail::load;
using detail::store;

[[noreturn]] inline void no_kernel(const char* op, DType dtype) {
  throw NotSupportedError(op, str_cat(op, " has no CPU kernel for ", dtype));
}

// fn.template operator()<T>() for the floating storage types that math kernels support.
template <typename Fn>
decltype(auto) visit_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<f16>();
    case DType::bf16: return fn.template operator()<bf16>();
    default: no_kernel(op, dtype);
  }
}

// Floating types plus the integer types (for comparisons, where, scatter, ...).
template <typename Fn>
decltype(auto) visit_numeric(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::i8: return fn.template operator()<int8_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    default: return visit_float(dtype, op, fn);
  }
}

// Reads integer ids (i32 or i64) as int64.
inline int64_t load_index(const Tensor& ids, int64_t element_offset) {
  if (ids.dtype() == DType::i32) return static_cast<const int32_t*>(ids.data_ptr())[element_offset];
  return static_cast<const int64_t*>(ids.data_ptr())[element_offset];
}

}  // namespace microllm::cpu
