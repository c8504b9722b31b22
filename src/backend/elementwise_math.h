// The formulas of the unary and binary ops and their derivatives, shared by the CPU and CUDA kernels
// so both backends compute the same function (internal header). A is float or double.
#pragma once

#include <cmath>
#include <type_traits>

#include "microllm/backend/kernel_params.h"
#include "microllm/backend/portability.h"

namespace microllm::math {

// e^x. On the GPU, f32 uses the hardware exp2 (__expf: a few ulp, far inside the f32 and bf16
// tolerances): the accurate expf is an instruction sequence that makes silu-like ops compute-bound.
template <typename A>
MICROLLM_HD inline A exp_fast(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) return __expf(x);
#endif
  return std::exp(x);
}

// 1 / (1 + e^-x); on the GPU in f32 with the approximate divide (exact enough, and a tenth of the work).
template <typename A>
MICROLLM_HD inline A sigmoid(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) return __fdividef(1.0f, 1.0f + __expf(-x));
#endif
  return A(1) / (A(1) + std::exp(-x));
}

// SwiGLU of one element: silu(gate) * up. The swiglu ops of both backends and the CUDA kernels that fold it in
// (the decode GEMV, the Hopper SwiGLU GEMM) all call this, so they give the same bits on the same inputs.
template <typename A>
MICROLLM_HD inline A swiglu(A gate, A up) {
  return gate * sigmoid(gate) * up;
}

template <typename A>
MICROLLM_HD inline A unary_forward(UnaryOp op, A x, A alpha) {
  constexpr A kSqrt2OverPi = A(0.7978845608028654);
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp_fast(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return A(1) / std::sqrt(x);
    case UnaryOp::sigmoid: return sigmoid(x);
    case UnaryOp::silu: return x * sigmoid(x);
    case UnaryOp::gelu: return A(0.5) * x * (A(1) + std::erf(x * A(0.7071067811865476)));
    case UnaryOp::gelu_tanh: return A(0.5) * x * (A(1) + std::tanh(kSqrt2OverPi * (x + A(0.044715) * x * x * x)));
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::scale: return alpha * x;
    case UnaryOp::square: return x * x;
  }
  return x;
}

// GeGLU of one element as the gelu_tanh and mul ops compute it: the gelu rounded to the storage type by `round` (the
// gelu op's output is a tensor of it), times up. CUDA's geglu fusion and the decode GEMV's gate both call this.
template <typename A, typename Round>
MICROLLM_HD inline A geglu(A gate, A up, Round round) {
  return round(unary_forward(UnaryOp::gelu_tanh, gate, A(0))) * up;
}

// d op(x) / dx
template <typename A>
MICROLLM_HD inline A unary_derivative(UnaryOp op, A x, A alpha) {
  constexpr A kSqrt2OverPi = A(0.7978845608028654);
  switch (op) {
    case UnaryOp::neg: return A(-1);
    case UnaryOp::exp: return std::exp(x);                      // d/dx e^x = e^x
    case UnaryOp::log: return A(1) / x;                         // d/dx ln x = 1/x
    case UnaryOp::sqrt: return A(0.5) / std::sqrt(x);           // d/dx x^1/2 = 1 / (2 sqrt x)
    case UnaryOp::rsqrt: return A(-0.5) / (x * std::sqrt(x));   // d/dx x^-1/2 = -x^-3/2 / 2
    case UnaryOp::sigmoid: { const A s = sigmoid(x); return s * (A(1) - s); }
    case UnaryOp::silu: { const A s = sigmoid(x); return s * (A(1) + x * (A(1) - s)); }
    case UnaryOp::gelu: {  // Phi(x) + x phi(x)
      const A cdf = A(0.5) * (A(1) + std::erf(x * A(0.7071067811865476)));
      const A pdf = std::exp(A(-0.5) * x * x) * A(0.3989422804014327);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const A inner = kSqrt2OverPi * (x + A(0.044715) * x * x * x);
      const A t = std::tanh(inner);
      const A d_inner = kSqrt2OverPi * (A(1) + A(3) * A(0.044715) * x * x);
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * d_inner;
    }
    case UnaryOp::tanh: { const A t = std::tanh(x); return A(1) - t * t; }
    case UnaryOp::scale: return alpha;
    case UnaryOp::square: return A(2) * x;
  }
  return A(0);
}

// Arithmetic binary ops (T: the compute type, float/double or int64 for integer tensors).
template <typename T>
MICROLLM_HD inline T binary_arith(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return a > b || a != a ? a : b;  // NaN propagates, as in torch.maximum
    case BinaryOp::minimum: return a < b || a != a ? a : b;
    default: return T(0);
  }
}

template <typename T>
MICROLLM_HD inline bool binary_compare(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::eq: return a == b;
    case BinaryOp::ne: return a != b;
    case BinaryOp::lt: return a < b;
    case BinaryOp::le: return a <= b;
    case BinaryOp::gt: return a > b;
    case BinaryOp::ge: return a >= b;
    default: return false;
  }
}

}  // namespace microllm::math
