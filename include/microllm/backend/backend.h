// The one list of primitive kernels. Every backend implements every entry: a backend that forgets one does not
// compile. A kernel that lacks a dtype throws NotSupportedError ("rms_norm has no CUDA kernel for f16"). Kernels
// that fuse several primitives are a table of their own, each defaulting to its composition: fusions.h.
//
// The contract between ops and kernels: ops (src/ops/) have already checked shapes, dtypes and devices,
// broadcast inputs with expand() where the op broadcasts, and allocated the outputs (contiguous, on the
// inputs' device). Inputs may be any strided view. Kernels write every element of every output.
#pragma once

#include <vector>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm {

// The per-step scalars of the optimizer kernels, computed on the host from the step count.
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double bias_correction1 = 1;  // 1 - beta1^step
  double bias_correction2 = 1;  // 1 - beta2^step
  int64_t step = 1;             // the 1-based step count; seeds the stochastic rounding of bf16 moments
};

struct SgdStep {
  double lr = 1e-2;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the first (decayed) gradient, as in PyTorch
  int64_t step = 1;         // the 1-based step count; seeds the stochastic rounding of bf16 buffers
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- elementwise (src/backend/*/elementwise.*) ----
  // out = op(x); grad_x = grad_out * op'(x).
  virtual void unary(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) = 0;
  virtual void unary_backward(UnaryOp op, const Tensor& x, double alpha, const Tensor& grad_out,
                              const Tensor& grad_x) = 0;
  // a and b are expanded to out's shape.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = cond ? a : b, all expanded to out's shape; cond is u8.
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;

  // ---- reductions and indexing (reduce.*, indexing.*) ----
  // Reduces `dim` of x; out has x's shape with that dim of size 1.
  virtual void reduce(ReduceOp op, const Tensor& x, int dim, const Tensor& out) = 0;
  // Index (i64) of the first maximum along `dim`; out has x's shape with that dim of size 1.
  virtual void argmax(const Tensor& x, int dim, const Tensor& out) = 0;
  // The k largest along the last dim, sorted descending (ties: lower index first); indices are i64.
  virtual void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) = 0;
  // out[..., index[..., j, ...], ...] += src[..., j, ...] along `dim`; index (i64) has src's shape.
  virtual void scatter_add(const Tensor& index, const Tensor& src, int dim, const Tensor& out) = 0;
  // out[n, :] = weight[ids[n], :]; ids are i32 or i64, already checked to lie in [0, vocab).
  virtual void embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) = 0;
  // grad_weight = 0, then grad_weight[ids[n], :] += grad_out[n, :].
  virtual void embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) = 0;

  // ---- matmul (matmul.*) ----
  // out[b] = op(a[b]) @ op(b[b]) (+ bias) (+ addend[b]), rounded once; a, b are [batch..., rows, cols] expanded
  // to out's batch dims; bias (may be undefined) is [N], added to every row (the epilogue of Linear); addend (may
  // be undefined) is contiguous in out's shape (the residual add of linear_add).
  virtual void matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias,
                      const Tensor& addend, const Tensor& out) = 0;
  // ---- normalization (norm.*) ----
  // h = round(x (+ residual)); out = round(weight * round(h * rsqrt(mean(h^2) + eps))) with round() to
  // x's dtype (Hugging Face's order). residual and h_out may be undefined (no residual); rstd_out (one per
  // row; f32, f64 for f64 inputs) is saved for the backward.
  virtual void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& out,
                        const Tensor& h_out, const Tensor& rstd_out) = 0;
  virtual void rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                                 const Tensor& grad_h, const Tensor& grad_weight) = 0;

  // ---- rotary embedding (rope.*) ----
  // x is [B, T, H, D]; positions [B, T] (i32/i64; may be a stride-0 expanded view of [T]). inverse
  // rotates by -angle (the backward). Frequencies come from microllm/backend/rope_math.h.
  virtual void rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
                    const Tensor& out) = 0;

  // ---- activations (activation.*) ----
  // out = silu(gate) * up
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out, const Tensor& grad_gate,
                               const Tensor& grad_up) = 0;

  // ---- softmax over the last dim (softmax.*) ----
  virtual void softmax(const Tensor& x, bool log, const Tensor& out) = 0;
  // From the forward's output y: softmax: dx = y * (g - sum(g y)); log: dx = g - exp(y) * sum(g).
  virtual void softmax_backward(const Tensor& y, const Tensor& grad_out, bool log, const Tensor& grad_x) = 0;

  // ---- attention (attention.*) ----
  // q [B, Hq, T, D], k and v [B, Hkv, S, D], Hq % Hkv == 0; mask (u8, may be undefined) is expanded to
  // [B, Hq, T, S], nonzero = may attend. out [B, Hq, T, D], any strides with a unit one along D (ops passes a
  // token-major view); lse [B, Hq, T] f32 contiguous (log-sum-exp of the scaled scores, -inf for a row that
  // attends to nothing; such a row outputs 0).
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionParams& params, const Tensor& out, const Tensor& lse) = 0;
  // `out` and `lse` are the forward's; a kernel may recompute either instead (the CPU reference recomputes
  // rowsum(dO * O) as rowsum(P * dP), and lse in f64 for f64 inputs, so its gradients are exact).
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const AttentionParams& params, const Tensor& out, const Tensor& lse,
                                  const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v) = 0;

  // ---- paged KV cache (paged_attention.*) ----
  // One layer's cache: k_pool and v_pool [num_blocks, block_size, Hkv, D]; token slot s is row s % block_size
  // of block s / block_size. Index tensors are i32 of any strides. Kernels read them on the device only (no
  // host round trip, so a CUDA graph can replay the launch with new values); CUDA kernels skip out-of-range
  // slots / blocks / sequences and report them through the device error word, the CPU throws IndexError.
  // pool[slot[n]] = k[n] / v[n] (k, v [N, Hkv, D], any float dtype, converted); slot < 0 skips row n.
  virtual void paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                              const Tensor& slots) = 0;
  // q [N, Hq, D] (the pools' dtype); query n attends to keys 0..positions[n] of sequence seq_ids[n], whose
  // blocks are row seq_ids[n] of block_tables [S, max_blocks]; positions[n] < 0 writes zeros. scale is
  // resolved (> 0); max_context (>= 1) bounds positions + 1 (CUDA sizes its key split grid from it).
  // out [N, Hq, D] contiguous, q's dtype.
  virtual void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                               const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                               double scale, int64_t max_context, const Tensor& out, int64_t window) = 0;
  // paged_decode_advance (ops/paged_attention.h); ids, outbox and counter all undefined: no hand-over.
  virtual void paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size,
                                    const Tensor& ids, const Tensor& outbox, const Tensor& counter) = 0;
  // out [length, Hkv, D] contiguous = the first `length` token rows of the blocks listed in
  // block_table_row [max_blocks] (length <= max_blocks * block_size).
  virtual void paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length,
                            const Tensor& out) = 0;

  // ---- loss (loss.*) ----
  // logits [N, V], targets [N] (i32/i64). loss (rank 0; f32, or f64 for f64 logits) = mean over targets
  // != ignore_index of logsumexp(logits[n]) - logits[n, targets[n]]; 0 when every target is ignored.
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& loss) = 0;
  // grad_logits = grad_loss * (softmax(logits) - onehot(target)) / count for kept rows, 0 for ignored.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                      const Tensor& grad_loss, const Tensor& grad_logits) = 0;

  // ---- sampling (sampling.*) ----
  // The next token of every row of logits [B, V] (f32/bf16/f16, any strides) by the rule of
  // microllm/backend/sampling_math.h: params f32 [B, 8], rng i64 [B, 2] (seed, offset), counts i32 [B, V] or
  // undefined (no penalties), bias f32 [B, V] or undefined (no logit bias; a row reads its bias only when its
  // params' kLogitBias column is 1); out i32 [B]. Updates the state on the device: offset += 1 and, when
  // counts is defined, counts[b, out[b]] += 1. Any strides for every tensor (narrowed views of bigger state).
  // greedy_only: the caller promises every row has temperature 0 (SamplerRows::greedy_only), so the kernels
  // skip the candidate sort; a row that breaks the promise is an error (CPU: thrown before any state changes;
  // CUDA: reported through the device error word, raised at the next synchronization).
  virtual void sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                             const Tensor& bias, bool greedy_only, const Tensor& out) = 0;

  // ---- optimizers (optim.*) ----
  // Multi-tensor steps: lists with one entry per parameter, every tensor contiguous, entry i of each list
  // of params[i]'s numel. params and grads are f32; moments f32 or bf16 (all moments of a call share a
  // dtype). grad_scale is undefined (1) or an f32 one-element tensor on the device that multiplies every
  // gradient (the clip factor): kernels read it on the device, so the host never waits for it.
  // AdamW (decoupled decay): g = scale * grad; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  // p = p (1 - lr wd_i) - (lr / bc1) m / (sqrt(v / bc2) + eps).
  virtual void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                          const std::vector<double>& weight_decay, const Tensor& grad_scale,
                          const AdamWStep& step) = 0;
  // SGD (PyTorch's): d = scale * grad + wd_i p; buf = momentum buf + (1 - dampening) d (buf = d on the first
  // step); d = nesterov ? d + momentum buf : buf; p -= lr d. momentum_buffer is empty when momentum is 0.
  virtual void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
                        const Tensor& grad_scale, const SgdStep& step) = 0;
  // out (f32 [n]): out[i] = sum of tensors[i]^2 (f32 or bf16 inputs), summed in a fixed order, so every run
  // gives the same bits (no atomics).
  virtual void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) = 0;
};

// The backend of a device: the CPU reference, or CUDA when this build has it.
Backend& backend_for(Device device);
Backend& cpu_backend();

// Whether f32 matmuls on CUDA may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation):
// several times faster, but results differ from f32 by about 1e-3 relative. Off by default; process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Whether CUDA kernels must give the same bits on every run (on by default; process-wide). It matters for the
// GEMMs' timed algorithm choice (set_gemm_tuning: only candidates with the heuristic's bits) and for the flash
// attention backward: deterministic, each key block writes its dQ part to an f32 buffer ([key blocks, rows,
// head_dim]) that one kernel sums in a fixed order; otherwise the parts are added with f32 atomics (less memory,
// slightly faster, but the order of the adds, and so the low bits, vary between runs, which breaks bit-exact
// resume of training). MICROLLM_DETERMINISTIC=0 turns it off (read once, at the first call).
void set_deterministic_algorithms(bool deterministic);
bool deterministic_algorithms();

// Whether CUDA linear layers of decode size (m <= 8 rows, bf16/f16, x @ w^T) run the weight-streaming GEMV
// (src/backend/cuda/gemv.cu) instead of cuBLASLt. On by default; MICROLLM_DISABLE=gemv in the environment
// turns it off (read once, at the first call); set_decode_gemv overrides both (process-wide), so one run
// can time the two paths. A CUDA graph keeps the path that was chosen when it was captured.
void set_decode_gemv(bool enabled);
bool decode_gemv();

// Whether CUDA's linear_swiglu (the MLP's input half, rms_norm_linear's last step) at prefill size (2,048+ rows,
// bf16/f16) runs as one Hopper GEMM with SwiGLU in the epilogue (src/backend/cuda/gemm_swiglu_sm90.cu) on an sm_90
// GPU, instead of cuBLASLt and then the swiglu kernel. On by default; MICROLLM_DISABLE=swiglu-gemm turns it off (read
// once, at the first call); set_fused_swiglu_gemm overrides both (process-wide). A CUDA graph keeps the path
// that was chosen when it was captured.
void set_fused_swiglu_gemm(bool enabled);
bool fused_swiglu_gemm();

// Whether a CUDA matmul of half precision and at least a GFLOP times cuBLASLt's candidate algorithms at the first
// use of its shape and keeps the fastest (src/backend/cuda/gemm_tuning.h), instead of taking the heuristic's
// first choice. On by default; MICROLLM_DISABLE=gemm-tuning turns it off (read once, at the first call);
// set_gemm_tuning overrides both (process-wide). A shape keeps the algorithm chosen at its first use. Under
// deterministic_algorithms() only candidates that give the heuristic's choice's bits may be chosen, so results
// do not depend on which one won the timing in this process.
void set_gemm_tuning(bool enabled);
bool gemm_tuning();

// Whether the CUDA flash attention forward runs its Hopper kernel (wgmma, src/backend/cuda/
// attention_flash_fwd_sm90.cu) on an sm_90 GPU (H100 / H200) when the build has sm_90a machine code, instead of
// the portable mma.sync kernel every sm_80+ GPU runs. On by default; MICROLLM_DISABLE=flash-wgmma turns it off (read
// once, at the first call); set_flash_wgmma overrides both (process-wide), so tests and benchmarks can run the
// two kernels side by side.
void set_flash_wgmma(bool enabled);
bool flash_wgmma();

}  // namespace microllm
