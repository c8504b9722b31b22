#include "microllm/nn/layers.h"

#include <cmath>

#include "microllm/autograd/functions.h"
#include "microllm/nn/transformer.h"

namespace microllm::nn {

namespace ag = autograd;

Tensor Initializer::normal(const Shape& shape) {
  return random_ ? Tensor::randn(shape, gen_, DType::f32, Device::cpu(), 0, std_) : Tensor::empty(shape, DType::f32);
}

// The parameter as the forward computes with it: cast to the compute dtype (a differentiable cast, so
// the gradient of an f32 master arrives in f32).
static Variable as_compute(const Variable& parameter, const ForwardContext& ctx) {
  return ag::cast(parameter, ctx.compute_dtype);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Initializer& init) {
  weight_ = &register_parameter("weight", init.normal({out_features, in_features}));
  if (bias) bias_ = &register_parameter("bias", Initializer::zeros({out_features}), /*weight_decay=*/false);
}

Variable Linear::forward(const Variable& x, const ForwardContext& ctx) const {
  return ag::linear(x, as_compute(*weight_, ctx), bias_ ? as_compute(*bias_, ctx) : Variable());
}

Embedding::Embedding(int64_t vocab, int64_t dim, Initializer& init) {
  weight_ = &register_parameter("weight", init.normal({vocab, dim}), /*weight_decay=*/false);
}

Variable Embedding::forward(const Tensor& ids, const ForwardContext& ctx) const {
  return ag::embedding(as_compute(*weight_, ctx), ids);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) {
  weight_ = &register_parameter("weight", Initializer::ones({dim}), /*weight_decay=*/false);
}

Variable RMSNorm::forward(const Variable& x, const ForwardContext& ctx) const {
  return ag::rms_norm(x, as_compute(*weight_, ctx), eps_);
}

std::pair<Variable, Variable> RMSNorm::forward_residual(const Variable& x, const Variable& residual,
                                                        const ForwardContext& ctx) const {
  return ag::rms_norm_residual(x, residual, as_compute(*weight_, ctx), eps_);
}

Attention::Attention(const AttentionConfig& config, int layer_index, Initializer& init)
    : config_(config), layer_index_(layer_index) {
  const int64_t q_dim = config.num_heads * config.head_dim, kv_dim = config.num_kv_heads * config.head_dim;
  q_proj_ = &register_module("q_proj", std::make_unique<Linear>(config.hidden_size, q_dim, config.qkv_bias, init));
  k_proj_ = &register_module("k_proj", std::make_unique<Linear>(config.hidden_size, kv_dim, config.qkv_bias, init));
  v_proj_ = &register_module("v_proj", std::make_unique<Linear>(config.hidden_size, kv_dim, config.qkv_bias, init));
  o_proj_ = &register_module("o_proj", std::make_unique<Linear>(q_dim, config.hidden_size, false, init));
  if (config.qk_norm) {
    q_norm_ = &register_module("q_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
    k_norm_ = &register_module("k_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
  }
}

Variable Attention::forward(const Variable& x, const ForwardContext& ctx) const {
  const int64_t batch = x.size(0), tokens = x.size(1), d = config_.head_dim;
  Variable q = ag::reshape(q_proj_->forward(x, ctx), {batch, tokens, config_.num_heads, d});     // [B, T, Hq, D]
  Variable k = ag::reshape(k_proj_->forward(x, ctx), {batch, tokens, config_.num_kv_heads, d});  // [B, T, Hkv, D]
  Variable v = ag::reshape(v_proj_->forward(x, ctx), {batch, tokens, config_.num_kv_heads, d});
  if (q_norm_) {
    q = q_norm_->forward(q, ctx);
    k = k_norm_->forward(k, ctx);
  }
  q = ag::rope(q, ctx.positions, config_.rope);
  k = ag::rope(k, ctx.positions, config_.rope);
  AttentionParams params;
  Variable keys = ag::transpose(k, 1, 2), values = ag::transpose(v, 1, 2);  // [B, Hkv, S, D]
  if (ctx.cache) {
    MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, "attention", "the KV cache is for inference: use a NoGradGuard");
    params.q_offset = ctx.cache->length();
    auto [cached_k, cached_v] = ctx.cache->append(layer_index_, k.value(), v.value());
    keys = Variable(cached_k);
    values = Variable(cached_v);
  }
  Variable out = ag::attention(ag::transpose(q, 1, 2), keys, values, params, ctx.attention_mask);  // [B, Hq, T, D]
  out = ag::reshape(ag::transpose(out, 1, 2), {batch, tokens, config_.num_heads * d});
  return o_proj_->forward(out, ctx);
}

Mlp::Mlp(int64_t hidden_size, int64_t intermediate_size, Initializer& init) {
  gate_proj_ = &register_module("gate_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  up_proj_ = &register_module("up_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  down_proj_ = &register_module("down_proj", std::make_unique<Linear>(intermediate_size, hidden_size, false, init));
}

Variable Mlp::forward(const Variable& x, const ForwardContext& ctx) const {
  return down_proj_->forward(ag::swiglu(gate_proj_->forward(x, ctx), up_proj_->forward(x, ctx)), ctx);
}

DecoderLayer::DecoderLayer(const AttentionConfig& attention, int64_t intermediate_size, int layer_index,
                           Initializer& init) {
  input_layernorm_ = &register_module("input_layernorm", std::make_unique<RMSNorm>(attention.hidden_size, attention.rms_norm_eps));
  self_attn_ = &register_module("self_attn", std::make_unique<Attention>(attention, layer_index, init));
  post_attention_layernorm_ = &register_module(
      "post_attention_layernorm", std::make_unique<RMSNorm>(attention.hidden_size, attention.rms_norm_eps));
  mlp_ = &register_module("mlp", std::make_unique<Mlp>(attention.hidden_size, intermediate_size, init));
}

Variable DecoderLayer::forward(const Variable& x, const ForwardContext& ctx) const {
  const Variable attn = self_attn_->forward(input_layernorm_->forward(x, ctx), ctx);
  auto [normed, h] = post_attention_layernorm_->forward_residual(attn, x, ctx);  // h = x + attn
  return ag::add(h, mlp_->forward(normed, ctx));
}

}  // namespace microllm::nn
