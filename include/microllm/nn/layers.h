// The blocks of a decoder-only transformer, with Hugging Face parameter names:
// Linear (weight [out, in], optional bias), Embedding (weight [vocab, dim]), RMSNorm (weight [dim]),
// Attention (q/k/v/o projections, GQA, optional QKV bias, optional QK-norm, explicit head_dim, RoPE),
// Mlp (gated: gate_proj, up_proj, down_proj), DecoderLayer (pre or sandwich norms). These are the training graph;
// inference runs the same weights through generate::Runner.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "microllm/core/random.h"
#include "microllm/nn/module.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/rope.h"

namespace microllm::nn {

struct TransformerConfig;
class Taps;

// Where a block's RMSNorms sit (DecoderLayer).
enum class NormPlacement : uint8_t { pre, sandwich };
// The gated MLP's activation: silu (SwiGLU: Llama, Qwen, Mistral) or gelu_tanh (GeGLU: Gemma).
enum class MlpActivation : uint8_t { silu, gelu_tanh };

// What a forward needs besides its input. The modules here are the training graph (what autograd
// differentiates, and the reference the inference runner is tested against): no KV cache, no inference modes.
struct ForwardContext {
  Tensor positions;                  // [B, T] or [T] i64: the absolute position of each token; undefined: 0..T-1
  DType compute_dtype = DType::f32;  // parameters are cast to it: f32 masters with bf16 compute in mixed precision
  Tensor attention_mask;             // optional u8, broadcastable to [B, Hq, T, T] (padding in batches)
  Taps* taps = nullptr;              // the named points to report (nn/taps.h); null: none, at no cost
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
  Variable forward(const Variable& x, const ForwardContext& ctx) const;  // x @ weight^T (+ bias)
  Variable& weight() { return *weight_; }
  const Variable& weight() const { return *weight_; }
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
  // The fused weight [sum of out, in] and bias (undefined without biases) when fuse() left the parts as rows of
  // one buffer; else an undefined weight.
  struct Joined {
    Tensor weight, bias;
  };
  Joined joined() const;
  const std::vector<Linear*>& parts() const { return parts_; }

 private:
  std::vector<Linear*> parts_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Initializer& init);
  Variable forward(const Tensor& ids, const ForwardContext& ctx) const;
  Variable& weight() { return *weight_; }
  const Variable& weight() const { return *weight_; }

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
  const Variable& weight() const { return *weight_; }
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
  int64_t window = 0;  // sliding window: each query sees its `window` latest keys; 0: every earlier key
  double scale = 0;    // the scores' scale; 0: 1 / sqrt(head_dim)
};

class Attention : public Module {
 public:
  // name: the module's path, which names its taps ("model.layers.3.self_attn").
  Attention(const AttentionConfig& config, Initializer& init, std::string name = "self_attn");
  // x [B, T, hidden] -> [B, T, hidden]: causal attention over the T tokens (and ctx's mask).
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  // Inference: q/k/v as rows of one buffer (see FusedProjections).
  void fuse_projections() { qkv_.fuse(); }

  const AttentionConfig& config() const { return config_; }
  const FusedProjections& qkv() const { return qkv_; }  // q_proj, k_proj, v_proj
  const Linear& o_proj() const { return *o_proj_; }
  const RMSNorm* q_norm() const { return q_norm_; }  // null without QK-norm
  const RMSNorm* k_norm() const { return k_norm_; }

 private:
  AttentionConfig config_;
  std::string name_;
  Linear *q_proj_, *k_proj_, *v_proj_, *o_proj_;
  FusedProjections qkv_;
  RMSNorm *q_norm_ = nullptr, *k_norm_ = nullptr;
};

// The gated MLP: down(act(gate(x)) * up(x)), act silu (SwiGLU) or gelu_tanh (GeGLU).
class Mlp : public Module {
 public:
  Mlp(int64_t hidden_size, int64_t intermediate_size, MlpActivation activation, Initializer& init,
      std::string name = "mlp");
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  void fuse_projections() { gate_up_.fuse(); }  // inference: gate and up as rows of one buffer

  MlpActivation activation() const { return activation_; }
  const FusedProjections& gate_up() const { return gate_up_; }  // gate_proj, up_proj
  const Linear& down_proj() const { return *down_proj_; }

 private:
  MlpActivation activation_;
  std::string name_;
  Linear *gate_proj_, *up_proj_, *down_proj_;
  FusedProjections gate_up_;
};

// One block, as its family's description (TransformerConfig's norm placement, attention options, MLP
// activation) builds it, with Hugging Face's module names:
//   pre       h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))
//   sandwich  h = x + post_attention_layernorm(attn(input_layernorm(x)));
//             out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
class DecoderLayer : public Module {
 public:
  DecoderLayer(const TransformerConfig& config, int index, Initializer& init);
  Variable forward(const Variable& x, const ForwardContext& ctx) const;
  // The same block with the residual adds left to the caller, so that each meets the next RMSNorm in one fused
  // kernel: the block's input is residual + x (just x when residual is undefined); returns (delta, h) whose sum
  // is forward()'s output.
  std::pair<Variable, Variable> forward_unsummed(const Variable& x, const Variable& residual,
                                                 const ForwardContext& ctx) const;
  void fuse_projections() {
    self_attn_->fuse_projections();
    mlp_->fuse_projections();
  }

  NormPlacement placement() const { return placement_; }
  const RMSNorm& input_norm() const { return *input_layernorm_; }
  // pre: the MLP's input norm (Hugging Face's post_attention_layernorm); sandwich: the attention output's norm.
  const RMSNorm& post_attention_norm() const { return *post_attention_layernorm_; }
  const RMSNorm* pre_feedforward_norm() const { return pre_feedforward_layernorm_; }  // sandwich only
  const RMSNorm* post_feedforward_norm() const { return post_feedforward_layernorm_; }
  const Attention& attention() const { return *self_attn_; }
  const Mlp& mlp() const { return *mlp_; }

 private:
  NormPlacement placement_;
  int index_;         // in the model: names its trace spans
  std::string name_;  // "model.layers.<index>": names its taps
  RMSNorm *input_layernorm_, *post_attention_layernorm_;
  RMSNorm *pre_feedforward_layernorm_ = nullptr, *post_feedforward_layernorm_ = nullptr;
  Attention* self_attn_;
  Mlp* mlp_;
};

}  // namespace microllm::nn
