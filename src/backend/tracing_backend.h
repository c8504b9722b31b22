// Backends and fusions that wrap another and put a trace span around each of its kernels (`profile::Scope`, category
// "op", named after the op): backend_for and fusions_for hand them out while a trace session runs, so an op's
// span shows its host time (a CPU kernel's whole run; a CUDA kernel's launch, its GPU time being the CUDA op
// scope's GPU span). Internal header.
#pragma once

#include "microllm/backend/backend.h"
#include "microllm/backend/fusions.h"

namespace microllm {

class TracingBackend final : public Backend {
 public:
  explicit TracingBackend(Backend& inner) : inner_(inner) {}
  const char* name() const override { return inner_.name(); }

  void unary(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) override;
  void unary_backward(UnaryOp op, const Tensor& x, double alpha, const Tensor& grad_out, const Tensor& grad_x) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, int dim, const Tensor& out) override;
  void argmax(const Tensor& x, int dim, const Tensor& out) override;
  void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) override;
  void scatter_add(const Tensor& index, const Tensor& src, int dim, const Tensor& out) override;
  void embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) override;
  void matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias,
              const Tensor& addend, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& out,
                const Tensor& h_out, const Tensor& rstd_out) override;
  void rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                         const Tensor& grad_h, const Tensor& grad_weight) override;
  void rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
            const Tensor& out) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out, const Tensor& grad_gate,
                       const Tensor& grad_up) override;
  void softmax(const Tensor& x, bool log, const Tensor& out) override;
  void softmax_backward(const Tensor& y, const Tensor& grad_out, bool log, const Tensor& grad_x) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionParams& params,
                 const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          const AttentionParams& params, const Tensor& out, const Tensor& lse, const Tensor& grad_out,
                          const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) override;
  void paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                      const Tensor& slots) override;
  void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                       const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                       const Tensor& out, int64_t window) override;
  void paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size, const Tensor& ids,
                            const Tensor& outbox, const Tensor& counter) override;
  void paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length, const Tensor& out) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& loss) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& grad_loss, const Tensor& grad_logits) override;
  void sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                     const Tensor& bias, bool greedy_only, const Tensor& out) override;
  void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                  const std::vector<double>& weight_decay, const Tensor& grad_scale, const AdamWStep& step) override;
  void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
                const Tensor& grad_scale, const SgdStep& step) override;
  void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) override;

 private:
  Backend& inner_;
};

class TracingFusions final : public Fusions {
 public:
  TracingFusions(Backend& primitives, Fusions& inner) : Fusions(primitives), inner_(inner) {}

  void linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) override;
  void rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual, const Tensor& norm_weight,
                       double eps, const Tensor& weight, const Tensor& bias, GatedActivation gate, const Tensor& out,
                       const Tensor& h_out) override;
  void geglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void sandwich_rms_norm(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                         const Tensor& norm_weight, double eps, const Tensor& out, const Tensor& h_out,
                         const Tensor& rstd) override;
  bool folds_rms_norm_linear(int64_t rows, const Tensor& weight, GatedActivation gate) const override;
  void qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight, double eps,
                   const Tensor& q_out, const Tensor& k_out) override;
  void paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                              const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                              const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions, double scale,
                              int64_t max_context, const Tensor& out, int64_t window,
                              const QkNormParams& qk_norm) override;
  void paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                        const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                        const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                        double scale, int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                        const Tensor& out, int64_t window, const QkNormParams& qk_norm) override;
  void paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                           const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                           const Tensor& q_out, const Tensor& k_out) override;

 private:
  Fusions& inner_;
};

}  // namespace microllm
