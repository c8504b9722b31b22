#include "tracing_backend.h"

#include <string>

#include "microllm/core/error.h"
#include "microllm/profile/trace.h"

namespace microllm {

using profile::Scope;

void TracingBackend::unary(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) {
  Scope span(unary_op_name(op), "op");
  inner_.unary(op, x, alpha, out);
}

void TracingBackend::unary_backward(UnaryOp op, const Tensor& x, double alpha, const Tensor& grad_out,
                                    const Tensor& grad_x) {
  const std::string name = str_cat(unary_op_name(op), "_backward");
  Scope span(name.c_str(), "op");
  inner_.unary_backward(op, x, alpha, grad_out, grad_x);
}

void TracingBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  Scope span(binary_op_name(op), "op");
  inner_.binary(op, a, b, out);
}

void TracingBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  Scope span("where", "op");
  inner_.where(cond, a, b, out);
}

void TracingBackend::reduce(ReduceOp op, const Tensor& x, int dim, const Tensor& out) {
  Scope span(reduce_op_name(op), "op");
  inner_.reduce(op, x, dim, out);
}

void TracingBackend::argmax(const Tensor& x, int dim, const Tensor& out) {
  Scope span("argmax", "op");
  inner_.argmax(x, dim, out);
}

void TracingBackend::topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  Scope span("topk", "op");
  inner_.topk(x, k, values, indices);
}

void TracingBackend::scatter_add(const Tensor& index, const Tensor& src, int dim, const Tensor& out) {
  Scope span("scatter_add", "op");
  inner_.scatter_add(index, src, dim, out);
}

void TracingBackend::embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  Scope span("embedding", "op");
  inner_.embedding(weight, ids, out);
}

void TracingBackend::embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) {
  Scope span("embedding_backward", "op");
  inner_.embedding_backward(grad_out, ids, grad_weight);
}

void TracingBackend::matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias,
                            const Tensor& addend, const Tensor& out) {
  Scope span("matmul", "op");
  inner_.matmul(a, b, transpose_a, transpose_b, bias, addend, out);
}

void TracingBackend::rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                              const Tensor& out, const Tensor& h_out, const Tensor& rstd_out) {
  Scope span("rms_norm", "op");
  inner_.rms_norm(x, residual, weight, eps, out, h_out, rstd_out);
}

void TracingBackend::rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight,
                                       const Tensor& rstd, const Tensor& grad_h, const Tensor& grad_weight) {
  Scope span("rms_norm_backward", "op");
  inner_.rms_norm_backward(grad_out, h, weight, rstd, grad_h, grad_weight);
}

void TracingBackend::rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
                          const Tensor& out) {
  Scope span("rope", "op");
  inner_.rope(x, positions, params, inverse, out);
}

void TracingBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  Scope span("swiglu", "op");
  inner_.swiglu(gate, up, out);
}

void TracingBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out,
                                     const Tensor& grad_gate, const Tensor& grad_up) {
  Scope span("swiglu_backward", "op");
  inner_.swiglu_backward(gate, up, grad_out, grad_gate, grad_up);
}

void TracingBackend::softmax(const Tensor& x, bool log, const Tensor& out) {
  Scope span("softmax", "op");
  inner_.softmax(x, log, out);
}

void TracingBackend::softmax_backward(const Tensor& y, const Tensor& grad_out, bool log, const Tensor& grad_x) {
  Scope span("softmax_backward", "op");
  inner_.softmax_backward(y, grad_out, log, grad_x);
}

void TracingBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                               const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  Scope span("attention", "op");
  inner_.attention(q, k, v, mask, params, out, lse);
}

void TracingBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                        const AttentionParams& params, const Tensor& out, const Tensor& lse,
                                        const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                                        const Tensor& grad_v) {
  Scope span("attention_backward", "op");
  inner_.attention_backward(q, k, v, mask, params, out, lse, grad_out, grad_q, grad_k, grad_v);
}

void TracingBackend::paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                                    const Tensor& slots) {
  Scope span("paged_kv_write", "op");
  inner_.paged_kv_write(k_pool, v_pool, k, v, slots);
}

void TracingBackend::paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                     const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                     double scale, int64_t max_context, const Tensor& out, int64_t window) {
  Scope span("paged_attention", "op");
  inner_.paged_attention(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out, window);
}

void TracingBackend::paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size,
                                          const Tensor& ids, const Tensor& outbox, const Tensor& counter) {
  Scope span("paged_decode_advance", "op");
  inner_.paged_decode_advance(inputs, block_tables, block_size, ids, outbox, counter);
}

void TracingBackend::paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length,
                                  const Tensor& out) {
  Scope span("paged_gather", "op");
  inner_.paged_gather(pool, block_table_row, length, out);
}

void TracingBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   const Tensor& loss) {
  Scope span("cross_entropy", "op");
  inner_.cross_entropy(logits, targets, ignore_index, loss);
}

void TracingBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                            const Tensor& grad_loss, const Tensor& grad_logits) {
  Scope span("cross_entropy_backward", "op");
  inner_.cross_entropy_backward(logits, targets, ignore_index, grad_loss, grad_logits);
}

void TracingBackend::sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                                   const Tensor& bias, bool greedy_only, const Tensor& out) {
  Scope span("sample_tokens", "op");
  inner_.sample_tokens(logits, params, rng, counts, bias, greedy_only, out);
}

void TracingBackend::adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                const std::vector<double>& weight_decay, const Tensor& grad_scale,
                                const AdamWStep& step) {
  Scope span("adamw_step", "op");
  inner_.adamw_step(params, grads, exp_avg, exp_avg_sq, weight_decay, grad_scale, step);
}

void TracingBackend::sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                              const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
                              const Tensor& grad_scale, const SgdStep& step) {
  Scope span("sgd_step", "op");
  inner_.sgd_step(params, grads, momentum_buffer, weight_decay, grad_scale, step);
}

void TracingBackend::sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) {
  Scope span("sum_squares", "op");
  inner_.sum_squares(tensors, out);
}

void TracingFusions::linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  Scope span("linear_swiglu", "op");
  inner_.linear_swiglu(x, weight, bias, out);
}

void TracingFusions::rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                     const Tensor& norm_weight, double eps, const Tensor& weight, const Tensor& bias,
                                     GatedActivation gate, const Tensor& out, const Tensor& h_out) {
  Scope span("rms_norm_linear", "op");
  inner_.rms_norm_linear(x, x_norm_weight, residual, norm_weight, eps, weight, bias, gate, out, h_out);
}

bool TracingFusions::folds_rms_norm_linear(int64_t rows, const Tensor& weight, GatedActivation gate) const {
  return inner_.folds_rms_norm_linear(rows, weight, gate);
}

void TracingFusions::geglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  Scope span("geglu", "op");
  inner_.geglu(gate, up, out);
}

void TracingFusions::sandwich_rms_norm(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                       const Tensor& norm_weight, double eps, const Tensor& out, const Tensor& h_out,
                                       const Tensor& rstd) {
  Scope span("sandwich_rms_norm", "op");
  inner_.sandwich_rms_norm(x, x_norm_weight, residual, norm_weight, eps, out, h_out, rstd);
}

void TracingFusions::qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                                 double eps, const Tensor& q_out, const Tensor& k_out) {
  Scope span("qk_rms_norm", "op");
  inner_.qk_rms_norm(q, k, q_weight, k_weight, eps, q_out, k_out);
}

void TracingFusions::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                            const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                            const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                            double scale, int64_t max_context, const Tensor& out, int64_t window,
                                            const QkNormParams& qk_norm) {
  Scope span("paged_decode_attention", "op");
  inner_.paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                max_context, out, window, qk_norm);
}

void TracingFusions::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const RopeParams& rope, const Tensor& k_pool,
                                                      const Tensor& v_pool, const Tensor& slots,
                                                      const Tensor& block_tables, const Tensor& seq_ids,
                                                      const Tensor& positions, double scale, int64_t max_context,
                                                      const Tensor& o_weight, const Tensor& addend, const Tensor& out,
                                                      int64_t window, const QkNormParams& qk_norm) {
  Scope span("paged_decode_attention_projected", "op");
  inner_.paged_decode_attention_projected(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                          max_context, o_weight, addend, out, window, qk_norm);
}

void TracingFusions::paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                         const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                         const Tensor& slots, const Tensor& q_out, const Tensor& k_out) {
  Scope span("paged_rope_kv_write", "op");
  inner_.paged_rope_kv_write(q, k, v, positions, rope, k_pool, v_pool, slots, q_out, k_out);
}

}  // namespace microllm
