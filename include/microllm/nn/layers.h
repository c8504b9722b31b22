// The blocks of a decoder-only transformer, with Hugging Face parameter names:
// Linear (weight [out, in], optional bias), Embedding (weight [vocab, dim]), RMSNorm (weight [dim]),
// Attention (q/k/v/o projections, GQA, optional QKV bias, optional QK-norm, explicit head_dim, RoPE),
// Mlp (SwiGLU: gate_proj, up_proj, down_proj), DecoderLayer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/random.h"
#include "microllm/nn/module.h"

namespace microllm::nn {

class KvCache;
struct PagedBatch;

// What every forward needs besides its input.
struct ForwardContext {
  Tensor positions;                  // [B, T] or [T] i64: the absolute position of each token
  DType compute_dtype = DType::f32;  // parameters are cast to it: f32 masters with bf16 compute in mixed precision
  KvCache* cache = nullptr;          // inference: the keys and values of earlier tokens (no_grad only)
  Tensor attention_mask;             // optional u8, broadcastable to [B, Hq, T, S] (padding in batches)
  const PagedBatch* paged = nullptr;  // inference over a paged KV cache (nn/paged_kv_cache.h), instead of cache
  bool last_logits_only = false;      // TransformerLM::forward returns each sequence's last logits: [B, 1, vocab]
  // With last_logits_only at inference: i32 [B] on the model's device, for each sequence the row (a flat index
  // b * T + t into the batch's B * T rows) whose logits are returned instead of its row T - 1, so that prompts
  // padded past their last tokens can be batched and replayed from a CUDA graph (the rows are data, not launch
  // arguments).
  Tensor last_row;
};

// Where new parameters get their values: weights Normal(0, std) from a seeded generator (training from
// scratch), or left unwritten when a checkpoint is about to replace them (no time spent on random
// numbers for a billion weights, and untouched host pages cost no memory). Norm weights are ones and
// biases zeros either way.
class Initializer {
 public:
  Initializer(uint64_t seed, double std, bool random = true) : gen_(seed), std_(std), random_(random) {}
  Tensor normal(const Shape& shape);
  static Tensor ones(const Shape& shape) { return Tensor::ones(shape); }
  static Tensor zeros(const Shape& shape) { return Tensor::zeros(shape); }

 private:
  Generator gen_;
  double std_;
  bool random_;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Initializer& init);
  // x @ weight^T (+ bias); with an addend (inference only, x's shape but out_features wide), the sum addend +
  // x @ weight^T (+ bias) rounded once (ops linear_add): a residual add in the GEMM's epilogue.
  Variable forward(const Variable& x, const ForwardContext& ctx, const Tensor& addend = Tensor()) const;
  Variable& weight() { return *weight_; }
  Variable* bias() const { return bias_; }  // null without one

 private:
  Variable* weight_;
  Variable* bias_ = nullptr;
};

// Projections that read the same input, fused for inference: their weights (and biases) are moved into one
// buffer, each parameter becoming a view of its rows (the Hugging Face names and the training path are
// unchanged), so a no-grad forward makes one GEMM instead of several. fuse() is undone by anything that
// replaces a parameter's tensor (to(dtype), to(device), loading): then the projections run apart again.
class FusedProjections {
 public:
  FusedProjections() = default;
  explicit FusedProjections(std::vector<Linear*> parts) : parts_(std::move(parts)) {}
  void fuse();
  // x [.., in] -> [.., sum of out] when the parts are fused (and ctx's dtype is theirs), else undefined.
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // The fused weight [sum of out, in] and bias (undefined without biases) when forward() would use them (no
  // grad, fused, ctx's dtype); else an undefined weight.
  struct Joined {
    Tensor weight, bias;
  };
  Joined joined(const ForwardContext& ctx) const;

 private:
  std::vector<Linear*> parts_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Initializer& init);
  Variable forward(const Tensor& ids, const ForwardContext& ctx) const;
  Variable& weight() { return *weight_; }

 private:
  Variable* weight_;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  // {norm(x + residual), x + residual}
  std::pair<Variable, Variable> forward_residual(const Variable& x, const Variable& residual,
                                                 const ForwardContext& ctx) const;
  Tensor weight_for(const ForwardContext& ctx) const;  // the weight in ctx's compute dtype
  double eps() const { return eps_; }

 private:
  Variable* weight_;
  double eps_;
};

struct AttentionConfig {
  int64_t hidden_size, num_heads, num_kv_heads, head_dim;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  double rms_norm_eps = 1e-6;
  RopeParams rope;
};

class Attention : public Module {
 public:
  Attention(const AttentionConfig& config, int layer_index, Initializer& init);
  // x [B, T, hidden] -> [B, T, hidden]
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  // Inference: q/k/v in one GEMM (see FusedProjections).
  void fuse_projections() { qkv_.fuse(); }
  const FusedProjections& qkv_projections() const { return qkv_; }
  // The rest of forward() from the fused projections' output qkv [B, T, (Hq + 2 Hkv) D] (inference); with a
  // residual [B, T, hidden], residual + forward() (the add in the o projection's epilogue).
  Variable forward_qkv(const Tensor& qkv, const ForwardContext& ctx, const Tensor& residual = Tensor()) const;

 private:
  // forward() after the projections; qkv: their fused output when there is one (undefined in training);
  // residual: as forward_qkv's.
  Variable attend(Variable q, Variable k, Variable v, const Tensor& qkv, const ForwardContext& ctx,
                  const Tensor& residual = Tensor()) const;
  // The paged cache's two cases, both from q, k, v before the rotary embedding: a decode step (rotary, cache
  // write and attention in one op) and a prefill chunk (rotary and cache write in one op, then attention).
  Tensor paged_decode(const Tensor& q, const Tensor& k, const Tensor& v, const PagedBatch& paged,
                      const Tensor& o_weight, const Tensor& residual) const;
  Tensor paged_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const ForwardContext& ctx) const;

  AttentionConfig config_;
  int layer_index_;
  Linear *q_proj_, *k_proj_, *v_proj_, *o_proj_;
  FusedProjections qkv_;
  RMSNorm *q_norm_ = nullptr, *k_norm_ = nullptr;
};

class Mlp : public Module {
 public:
  Mlp(int64_t hidden_size, int64_t intermediate_size, Initializer& init);
  Variable forward(const Variable& x, const ForwardContext& ctx) const;  // down(silu(gate(x)) * up(x))
  void fuse_projections() { gate_up_.fuse(); }  // inference: gate and up in one GEMM
  const FusedProjections& gate_up_projections() const { return gate_up_; }
  // down_proj (+ residual in its epilogue, inference: Linear::forward's addend)
  Variable down(const Variable& activation, const ForwardContext& ctx, const Tensor& residual = Tensor()) const;

 private:
  Linear *gate_proj_, *up_proj_, *down_proj_;
  FusedProjections gate_up_;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const AttentionConfig& attention, int64_t intermediate_size, int layer_index, Initializer& init);
  // Pre-norm residual block: h = x + attn(norm1(x)); out = h + mlp(norm2(h)), with the second
  // residual add fused into norm2.
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  // The same layer with the residual adds left to the caller, so each meets the next RMSNorm in one fused
  // kernel: the layer's input is residual + x (just x when residual is undefined); returns (mlp output, h)
  // whose sum is forward()'s output. At inference with fused projections (forward_fused) the MLP's add rides
  // in the down projection's epilogue instead: it returns (the layer's output, undefined).
  std::pair<Variable, Variable> forward_unsummed(const Variable& x, const Variable& residual,
                                                 const ForwardContext& ctx) const;
  void fuse_projections() {
    self_attn_->fuse_projections();
    mlp_->fuse_projections();
  }

 private:
  // forward_unsummed at inference with fused projections: each RMSNorm and the projections after it are one
  // op (ops/norm_linear.h), SwiGLU included, so a CUDA decode layer is five kernels; the residual adds ride in
  // the projection before them (o, down: linear_add, one rounding where Hugging Face rounds twice), except the
  // attention's where the backend folds the MLP's RMSNorm into one kernel with gate_up (then there). Undefined
  // results when the fused weights are not there (then the general path runs).
  std::pair<Variable, Variable> forward_fused(const Variable& x, const Variable& residual,
                                              const ForwardContext& ctx) const;
  RMSNorm *input_layernorm_, *post_attention_layernorm_;
  Attention* self_attn_;
  Mlp* mlp_;
};

}  // namespace microllm::nn
