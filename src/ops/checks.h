// Argument checks shared by the ops (internal header). Each throws with the op and the offending value:
//   [rms_norm] weight has dtype f16 but input has dtype f32
#pragma once

#include "microllm/backend/backend.h"
#include "microllm/core/error.h"
#include "microllm/core/tensor.h"

namespace microllm::checks {

inline void defined(const char* op, const Tensor& t, const char* name) {
  MICROLLM_CHECK(t.defined(), ValueError, op, name, " is an undefined tensor");
}

// f32, f16, bf16 or f64: the dtypes math ops compute on.
inline void floating(const char* op, const Tensor& t, const char* name) {
  defined(op, t, name);
  const DType d = t.dtype();
  MICROLLM_CHECK(d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::f64, DTypeError, op, name,
                 " must be f32, f16, bf16 or f64, got ", d);
}

inline void index_dtype(const char* op, const Tensor& t, const char* name) {
  defined(op, t, name);
  MICROLLM_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, DTypeError, op, name, " must be i32 or i64, got ",
                 t.dtype());
}

inline void same_dtype(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MICROLLM_CHECK(a.dtype() == b.dtype(), DTypeError, op, b_name, " has dtype ", b.dtype(), " but ", a_name,
                 " has dtype ", a.dtype());
}

inline void same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MICROLLM_CHECK(a.device() == b.device(), DeviceError, op, b_name, " is on ", b.device(), " but ", a_name, " is on ",
                 a.device());
}

inline void rank(const char* op, const Tensor& t, const char* name, int expected) {
  MICROLLM_CHECK(t.dim() == expected, ShapeError, op, name, " must have rank ", expected, ", got shape ", t.shape());
}

inline void same_shape(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MICROLLM_CHECK(a.shape() == b.shape(), ShapeError, op, b_name, " shape ", b.shape(), " does not match ", a_name,
                 " shape ", a.shape());
}

// rope()'s input checks (src/ops/rope.cpp): x [B, T, H, D] floating with D even, positions [B, T] or [T] (i32/i64)
// on x's device, valid rotary parameters; returns the positions expanded to [B, T].
Tensor rope_positions(const char* op, const Tensor& x, const char* x_name, const Tensor& positions,
                      const RopeParams& params);

// QK-norm's weights (ops/qk_norm.h): q_weight and k_weight [D] with q's dtype and device, eps finite and > 0.
void qk_norm_weights(const char* op, const Tensor& q, const Tensor& q_weight, const Tensor& k_weight, double eps);

}  // namespace microllm::checks
