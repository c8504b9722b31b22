// The fusions' definitions: each the composition of the device's primitives (fusions.h).
#include "microllm/backend/fusions.h"

#include "cpu/cpu_backend.h"

namespace microllm {

#ifdef MICROLLM_WITH_CUDA
Fusions& cuda_fusions(int device);  // src/backend/cuda/cuda_backend.cpp
#endif

bool Fusions::folds_rms_norm_linear(int64_t, const Tensor&, GatedActivation) const { return false; }

void Fusions::rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                              const Tensor& norm_weight, double eps, const Tensor& weight, const Tensor& bias,
                              GatedActivation gate, const Tensor& out, const Tensor& h_out) {
  const Tensor rstd = Tensor::empty({x.size(0)}, x.dtype() == DType::f64 ? DType::f64 : DType::f32, x.device());
  const Tensor normed = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x_norm_weight.defined()) {
    sandwich_rms_norm(x, x_norm_weight, residual, norm_weight, eps, normed, h_out, rstd);
  } else {
    primitives_.rms_norm(x, residual, norm_weight, eps, normed, residual.defined() ? h_out : Tensor(), rstd);
  }
  switch (gate) {
    case GatedActivation::none:
      primitives_.matmul(normed, weight, /*transpose_a=*/false, /*transpose_b=*/true, bias, Tensor(), out);
      break;
    case GatedActivation::swiglu: linear_swiglu(normed, weight, bias, out); break;
    case GatedActivation::geglu: {
      const int64_t n = out.size(1);
      const Tensor gate_up = Tensor::empty({x.size(0), 2 * n}, x.dtype(), x.device());
      primitives_.matmul(normed, weight, /*transpose_a=*/false, /*transpose_b=*/true, bias, Tensor(), gate_up);
      geglu(gate_up.narrow(1, 0, n), gate_up.narrow(1, n, n), out);
      break;
    }
  }
}

void Fusions::geglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const Tensor activated = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  primitives_.unary(UnaryOp::gelu_tanh, gate, 0.0, activated);
  primitives_.binary(BinaryOp::mul, activated, up, out);
}

std::pair<Tensor, Tensor> Fusions::normalized_qk(const Tensor& q, const Tensor& k, const QkNormParams& norm) {
  const Tensor q_out = Tensor::empty(q.shape(), q.dtype(), q.device());
  const Tensor k_out = Tensor::empty(k.shape(), k.dtype(), k.device());
  qk_rms_norm(q, k, norm.q_weight, norm.k_weight, norm.eps, q_out, k_out);
  return {q_out, k_out};
}

void Fusions::sandwich_rms_norm(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                const Tensor& norm_weight, double eps, const Tensor& out, const Tensor& h_out,
                                const Tensor& rstd) {
  // the sublayer output's own norm, before the residual add: h itself without one
  const Tensor input = residual.defined() || !h_out.defined() ? Tensor::empty(x.shape(), x.dtype(), x.device()) : h_out;
  primitives_.rms_norm(x, Tensor(), x_norm_weight, eps, input, Tensor(), rstd);
  primitives_.rms_norm(input, residual, norm_weight, eps, out, residual.defined() ? h_out : Tensor(), rstd);
}

void Fusions::qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight, double eps,
                          const Tensor& q_out, const Tensor& k_out) {
  const DType stats = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  primitives_.rms_norm(q, Tensor(), q_weight, eps, q_out, Tensor(),
                       Tensor::empty({q.numel() / q.size(-1)}, stats, q.device()));
  primitives_.rms_norm(k, Tensor(), k_weight, eps, k_out, Tensor(),
                       Tensor::empty({k.numel() / k.size(-1)}, stats, k.device()));
}

void Fusions::linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const int64_t n = out.size(1);
  const Tensor gate_up = Tensor::empty({x.size(0), 2 * n}, x.dtype(), x.device());
  primitives_.matmul(x, weight, /*transpose_a=*/false, /*transpose_b=*/true, bias, Tensor(), gate_up);
  primitives_.swiglu(gate_up.narrow(1, 0, n), gate_up.narrow(1, n, n), out);
}

void Fusions::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope_params,
                                     const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                     const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                     double scale, int64_t max_context, const Tensor& out, int64_t window,
                                     const QkNormParams& qk_norm) {
  if (qk_norm.defined()) {  // QK-norm first (the fused qk_rms_norm where this table has one), then the rest
    const auto [q_normed, k_normed] = normalized_qk(q, k, qk_norm);
    Fusions::paged_decode_attention(q_normed, k_normed, v, rope_params, k_pool, v_pool, slots, block_tables, seq_ids,
                                    positions, scale, max_context, out, window, QkNormParams{});
    return;
  }
  // rope takes [B, T, H, D] with positions [B, T]: the N tokens as N sequences of one.
  const Tensor pos = positions.unsqueeze(1);
  const Tensor q_rot = Tensor::empty({q.size(0), 1, q.size(1), q.size(2)}, q.dtype(), q.device());
  const Tensor k_rot = Tensor::empty({k.size(0), 1, k.size(1), k.size(2)}, k.dtype(), k.device());
  primitives_.rope(q.unsqueeze(1), pos, rope_params, /*inverse=*/false, q_rot);
  primitives_.rope(k.unsqueeze(1), pos, rope_params, /*inverse=*/false, k_rot);
  primitives_.paged_kv_write(k_pool, v_pool, k_rot.select(1, 0), v, slots);
  primitives_.paged_attention(q_rot.select(1, 0), k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context,
                              out, window);
}

void Fusions::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const RopeParams& rope_params, const Tensor& k_pool,
                                               const Tensor& v_pool, const Tensor& slots, const Tensor& block_tables,
                                               const Tensor& seq_ids, const Tensor& positions, double scale,
                                               int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                               const Tensor& out, int64_t window, const QkNormParams& qk_norm) {
  const Tensor attention = Tensor::empty(q.shape(), q.dtype(), q.device());
  paged_decode_attention(q, k, v, rope_params, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                         max_context, attention, window, qk_norm);
  primitives_.matmul(attention.reshape({q.size(0), q.size(1) * q.size(2)}), o_weight, /*transpose_a=*/false,
                     /*transpose_b=*/true, Tensor(), addend, out);
}

void Fusions::paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                  const RopeParams& rope_params, const Tensor& k_pool, const Tensor& v_pool,
                                  const Tensor& slots, const Tensor& q_out, const Tensor& k_out) {
  primitives_.rope(q, positions, rope_params, /*inverse=*/false, q_out);
  primitives_.rope(k, positions, rope_params, /*inverse=*/false, k_out);
  const int64_t rows = k.size(0) * k.size(1);
  primitives_.paged_kv_write(k_pool, v_pool, k_out.reshape({rows, k.size(2), k.size(3)}),
                             v.reshape({rows, v.size(2), v.size(3)}), slots);
}

// The fusions of `device`, whose primitives backend_for checked and returned (backend.cpp wraps them for tracing).
Fusions& fusions_of(Device device, Backend& primitives) {
  if (device.is_cpu()) {
    static CpuFusions fusions(primitives);
    return fusions;
  }
#ifdef MICROLLM_WITH_CUDA
  return cuda_fusions(device.index);
#else
  throw NotSupportedError("backend", str_cat("no fusions for ", device));
#endif
}

}  // namespace microllm
