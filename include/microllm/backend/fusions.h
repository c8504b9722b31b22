// Kernels that fuse several primitives into one, kept apart from the primitives (backend.h) as MLX keeps its
// fast:: ops and candle its CustomOps. Each entry is defined by its composition of the device's primitives,
// which is the default here (src/backend/fusions.cpp): the reference its fused kernel is tested against
// (tests/ops/norm_linear_test.cpp, paged_attention_test.cpp, gemm_swiglu_cuda_test.cpp), and what runs wherever
// no fused kernel takes the call. A device overrides the entries it fuses: CUDA all of them (the decode GEMV, the
// Hopper SwiGLU GEMM, the paged decode and prefill kernels: src/backend/cuda/), the CPU paged_decode_attention
// (the contract checks the fused CUDA kernel relies on, then the composition). Inference only: no backward.
//
// The contract is the primitives': ops (src/ops/) have checked shapes, dtypes and devices and allocated the
// outputs; inputs may be strided views; kernels write every element of every output.
#pragma once

#include <utility>

#include "microllm/backend/backend.h"
#include "microllm/backend/gated_activation.h"

namespace microllm {

class Fusions {
 public:
  explicit Fusions(Backend& primitives) : primitives_(primitives) {}
  virtual ~Fusions() = default;
  Fusions(const Fusions&) = delete;
  Fusions& operator=(const Fusions&) = delete;

  // ---- linear layers (ops/norm_linear.h) ----
  // The MLP's input half after its RMSNorm: out [M, N] = swiglu(x @ w_gate^T + b_gate, x @ w_up^T + b_up) with
  // weight [2N, K] = [w_gate; w_up], x [M, K], bias [2N] or undefined, out [M, N] contiguous (rms_norm_linear's last
  // step). Composition: matmul into [M, 2N], then swiglu of its two halves. CUDA: one Hopper GEMM with SwiGLU in its
  // epilogue at prefill size (gemm_swiglu_sm90.cu).
  virtual void linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
  // rms_norm_linear on rows: x [M, K], x_norm_weight [K] or undefined, residual [M, K] or undefined, out [M, N]
  // contiguous, h_out [M, K] (undefined with neither a residual nor x_norm_weight). Composition: rms_norm of x
  // (x_norm_weight), rms_norm with the residual, then matmul, linear_swiglu (swiglu) or matmul, gelu and mul (geglu).
  // CUDA: the decode GEMV with all of them folded in for M <= 2 rows (gemv.cu).
  virtual void rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                               const Tensor& norm_weight, double eps, const Tensor& weight, const Tensor& bias,
                               GatedActivation gate, const Tensor& out, const Tensor& h_out);
  // GeGLU of a gate_up product's halves: out = round(gelu_tanh(gate)) * up, rounded (gate, up, out [M, N], any
  // strides). Composition: the gelu_tanh and mul primitives. CUDA: one kernel, the same bits.
  virtual void geglu(const Tensor& gate, const Tensor& up, const Tensor& out);
  // A sandwich block's norms (Gemma 3) before a projection: h = rms_norm(x, x_norm_weight) + residual (rounded; the
  // normalized x alone where residual is undefined), out = rms_norm(h, norm_weight); x, residual, out [M, K], h_out
  // [M, K] or undefined, rstd [M] (h's). Composition: the two rms_norms. CUDA: one kernel, x's norm in the same row
  // pass with the same sums (norm.cu).
  virtual void sandwich_rms_norm(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                 const Tensor& norm_weight, double eps, const Tensor& out, const Tensor& h_out,
                                 const Tensor& rstd);
  // Whether rms_norm_linear over `rows` rows with this weight runs as one kernel: then a residual added there costs
  // nothing extra. The composition never folds.
  virtual bool folds_rms_norm_linear(int64_t rows, const Tensor& weight, GatedActivation gate) const;

  // QK-norm (ops/qk_norm.h): q [.., Hq, D], k [.., Hk, D] (strided views), q_weight and k_weight [D], q_out and
  // k_out contiguous of q's and k's shapes. Composition: the two rms_norms. CUDA: one kernel, a warp a head.
  virtual void qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight, double eps,
                           const Tensor& q_out, const Tensor& k_out);
  // qk_rms_norm into new contiguous tensors of q's and k's shapes: {q_out, k_out}.
  std::pair<Tensor, Tensor> normalized_qk(const Tensor& q, const Tensor& k, const QkNormParams& norm);

  // ---- the paged KV cache (ops/paged_attention.h) ----
  // paged_decode_attention: qk_rms_norm where qk_norm is defined, rope on q and k at positions, k and v written at
  // slots, then paged_attention.
  virtual void paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                      const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                      const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                      double scale, int64_t max_context, const Tensor& out, int64_t window,
                                      const QkNormParams& qk_norm);
  // paged_decode_attention_projected: paged_decode_attention into a [N, Hq, D] temporary, then out [N, hidden] =
  // addend + temporary @ o_weight^T (matmul with the addend; addend may be undefined).
  virtual void paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                                const Tensor& slots, const Tensor& block_tables, const Tensor& seq_ids,
                                                const Tensor& positions, double scale, int64_t max_context,
                                                const Tensor& o_weight, const Tensor& addend, const Tensor& out,
                                                int64_t window, const QkNormParams& qk_norm);
  // paged_rope_kv_write: q_out = rope(q), k_out = rope(k) (contiguous [B, T, H, D]), then k_out and v written at
  // slots [B * T]; positions [B, T].
  virtual void paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                   const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                   const Tensor& slots, const Tensor& q_out, const Tensor& k_out);

 protected:
  Backend& primitives_;  // the same device's
};

// The fusions of `device` (CPU or CUDA), beside backend_for(device)'s primitives.
Fusions& fusions_for(Device device);

}  // namespace microllm
