// CPU elementwise kernels: one strided loop each, formulas from elementwise_math.h.
#include <type_traits>

#include "../elementwise_math.h"
#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {

void CpuBackend::unary(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) {
  cpu::visit_float(x.dtype(), unary_op_name(op), [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    const A a = static_cast<A>(alpha);
    detail::for_each_row<2>(out.shape(), {out.strides(), x.strides()}, [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        cpu::store(dst + off[0] + i * step[0], math::unary_forward<A>(op, cpu::load(src + off[1] + i * step[1]), a));
      }
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, double alpha, const Tensor& grad_out,
                                const Tensor& grad_x) {
  cpu::visit_float(x.dtype(), unary_op_name(op), [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const T* xs = static_cast<const T*>(x.data_ptr());
    const T* gs = static_cast<const T*>(grad_out.data_ptr());
    T* dst = static_cast<T*>(grad_x.data_ptr());
    const A a = static_cast<A>(alpha);
    detail::for_each_row<3>(grad_x.shape(), {grad_x.strides(), x.strides(), grad_out.strides()},
                            [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        const A xv = cpu::load(xs + off[1] + i * step[1]);
        const A g = cpu::load(gs + off[2] + i * step[2]);
        cpu::store(dst + off[0] + i * step[0], g * math::unary_derivative<A>(op, xv, a));
      }
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::visit_numeric(a.dtype(), binary_op_name(op), [&]<typename T>() {
    // Floats compute in f32/f64; integers in int64.
    using C = std::conditional_t<std::is_integral_v<T>, int64_t, cpu::acc_t<T>>;
    const T* as = static_cast<const T*>(a.data_ptr());
    const T* bs = static_cast<const T*>(b.data_ptr());
    const std::array<Strides, 3> strides{out.strides(), a.strides(), b.strides()};
    if (is_comparison(op)) {
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      detail::for_each_row<3>(out.shape(), strides, [&](const auto& off, int64_t n, const auto& step) {
        for (int64_t i = 0; i < n; ++i) {
          const C av = static_cast<C>(cpu::load(as + off[1] + i * step[1]));
          const C bv = static_cast<C>(cpu::load(bs + off[2] + i * step[2]));
          dst[off[0] + i * step[0]] = math::binary_compare<C>(op, av, bv) ? 1 : 0;
        }
      });
      return;
    }
    T* dst = static_cast<T*>(out.data_ptr());
    detail::for_each_row<3>(out.shape(), strides, [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        const C av = static_cast<C>(cpu::load(as + off[1] + i * step[1]));
        const C bv = static_cast<C>(cpu::load(bs + off[2] + i * step[2]));
        cpu::store(dst + off[0] + i * step[0], math::binary_arith<C>(op, av, bv));
      }
    });
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::visit_numeric(a.dtype(), "where", [&]<typename T>() {
    const auto* cs = static_cast<const uint8_t*>(cond.data_ptr());
    const T* as = static_cast<const T*>(a.data_ptr());
    const T* bs = static_cast<const T*>(b.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    detail::for_each_row<4>(out.shape(), {out.strides(), cond.strides(), a.strides(), b.strides()},
                            [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        dst[off[0] + i * step[0]] = cs[off[1] + i * step[1]] ? as[off[2] + i * step[2]] : bs[off[3] + i * step[3]];
      }
    });
  });
}

}  // namespace microllm
