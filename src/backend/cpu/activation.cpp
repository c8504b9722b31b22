// CPU SwiGLU: out = silu(gate) * up, and its backward.
#include "../elementwise_math.h"
#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  cpu::visit_float(gate.dtype(), "swiglu", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const T* gs = static_cast<const T*>(gate.data_ptr());
    const T* us = static_cast<const T*>(up.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    detail::for_each_row<3>(out.shape(), {out.strides(), gate.strides(), up.strides()},
                            [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        const A g = cpu::load(gs + off[1] + i * step[1]);
        const A u = cpu::load(us + off[2] + i * step[2]);
        cpu::store(dst + off[0] + i * step[0], math::swiglu(g, u));
      }
    });
  });
}

void CpuBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out,
                                 const Tensor& grad_gate, const Tensor& grad_up) {
  cpu::visit_float(gate.dtype(), "swiglu_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const T* gs = static_cast<const T*>(gate.data_ptr());
    const T* us = static_cast<const T*>(up.data_ptr());
    const T* dys = static_cast<const T*>(grad_out.data_ptr());
    T* dgs = static_cast<T*>(grad_gate.data_ptr());
    T* dus = static_cast<T*>(grad_up.data_ptr());
    detail::for_each_row<5>(grad_gate.shape(),
                            {grad_gate.strides(), grad_up.strides(), gate.strides(), up.strides(), grad_out.strides()},
                            [&](const auto& off, int64_t n, const auto& step) {
      for (int64_t i = 0; i < n; ++i) {
        const A g = cpu::load(gs + off[2] + i * step[2]);
        const A u = cpu::load(us + off[3] + i * step[3]);
        const A dy = cpu::load(dys + off[4] + i * step[4]);
        const A s = math::sigmoid(g);
        // d/dg silu(g) = s (1 + g (1 - s))
        cpu::store(dgs + off[0] + i * step[0], dy * u * s * (A(1) + g * (A(1) - s)));
        cpu::store(dus + off[1] + i * step[1], dy * g * s);
      }
    });
  });
}

}  // namespace microllm
