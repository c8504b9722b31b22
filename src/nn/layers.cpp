#include "microllm/nn/layers.h"

#include <cmath>
#include <tuple>

#include "microllm/autograd/functions.h"
#include "microllm/nn/taps.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/attention.h"
#include "microllm/profile/trace.h"

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

// The tap <module>.<point> of this forward (nn/taps.h); without taps, x itself and no name is built.
static Variable tap(const ForwardContext& ctx, const std::string& module, const char* point, const Variable& x) {
  if (ctx.taps == nullptr) return x;
  return (*ctx.taps)(*point ? str_cat(module, ".", point) : module, x);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Initializer& init) {
  weight_ = &register_parameter("weight", init.normal({out_features, in_features}));
  if (bias) bias_ = &register_parameter("bias", Initializer::zeros({out_features}), /*weight_decay=*/false);
}

Variable Linear::forward(const Variable& x, const ForwardContext& ctx) const {
  return ag::linear(x, as_compute(*weight_, ctx), bias_ ? as_compute(*bias_, ctx) : Variable());
}

void FusedProjections::fuse() {
  if (parts_.empty()) return;
  const Tensor& first = parts_.front()->weight().value();
  const bool biased = parts_.front()->bias() != nullptr;
  int64_t rows = 0;
  for (Linear* part : parts_) {
    const Tensor& w = part->weight().value();
    MICROLLM_CHECK(w.dtype() == first.dtype() && w.device() == first.device() && w.size(1) == first.size(1) &&
                       (part->bias() != nullptr) == biased,
                   ValueError, "fuse_projections", "the projections differ in dtype, device, input size or bias");
    rows += w.size(0);
  }
  auto fuse_into = [&](auto tensor_of, const Shape& shape) {
    const Tensor fused = Tensor::empty(shape, first.dtype(), first.device());
    int64_t at = 0;
    for (Linear* part : parts_) {
      Variable& v = tensor_of(part);
      const int64_t n = v.value().size(0);
      Tensor rows_of_part = fused.narrow(0, at, n);
      rows_of_part.copy_(v.value());
      v.set_value(rows_of_part);
      at += n;
    }
  };
  fuse_into([](Linear* l) -> Variable& { return l->weight(); }, Shape{rows, first.size(1)});
  if (biased) fuse_into([](Linear* l) -> Variable& { return *l->bias(); }, Shape{rows});
}

// The parts as one tensor when they are consecutive rows of one buffer (what fuse() left), else undefined.
static Tensor joined_rows(const std::vector<const Tensor*>& parts) {
  const Tensor& first = *parts.front();
  int64_t next = first.offset(), rows = 0;
  for (const Tensor* t : parts) {
    if (!t->shares_storage_with(first) || !t->is_contiguous() || t->offset() != next || t->dtype() != first.dtype()) {
      return Tensor();
    }
    next += t->numel();
    rows += t->size(0);
  }
  Shape shape = first.shape();
  shape[0] = rows;
  Strides strides = first.strides();
  return Tensor(first.storage(), shape, strides, first.offset(), first.dtype());
}

FusedProjections::Joined FusedProjections::joined() const {
  if (parts_.empty()) return {};
  std::vector<const Tensor*> weights, biases;
  for (Linear* part : parts_) {
    weights.push_back(&part->weight().value());
    if (part->bias()) biases.push_back(&part->bias()->value());
  }
  Joined fused{joined_rows(weights), biases.empty() ? Tensor() : joined_rows(biases)};
  if (!fused.weight.defined() || (!biases.empty() && !fused.bias.defined())) return {};
  return fused;
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

Attention::Attention(const AttentionConfig& config, Initializer& init, std::string name)
    : config_(config), name_(std::move(name)) {
  const int64_t q_dim = config.num_heads * config.head_dim, kv_dim = config.num_kv_heads * config.head_dim;
  q_proj_ = &register_module("q_proj", std::make_unique<Linear>(config.hidden_size, q_dim, config.qkv_bias, init));
  k_proj_ = &register_module("k_proj", std::make_unique<Linear>(config.hidden_size, kv_dim, config.qkv_bias, init));
  v_proj_ = &register_module("v_proj", std::make_unique<Linear>(config.hidden_size, kv_dim, config.qkv_bias, init));
  o_proj_ = &register_module("o_proj", std::make_unique<Linear>(q_dim, config.hidden_size, false, init));
  qkv_ = FusedProjections({q_proj_, k_proj_, v_proj_});
  if (config.qk_norm) {
    q_norm_ = &register_module("q_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
    k_norm_ = &register_module("k_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
  }
}

Variable Attention::forward(const Variable& x, const ForwardContext& ctx) const {
  const int64_t batch = x.size(0), tokens = x.size(1), d = config_.head_dim;
  auto project = [&](const Linear* proj, const char* point, int64_t heads) {  // -> [B, T, heads, D]
    return ag::reshape(tap(ctx, name_, point, proj->forward(x, ctx)), {batch, tokens, heads, d});
  };
  Variable q = project(q_proj_, "q_proj", config_.num_heads);
  Variable k = project(k_proj_, "k_proj", config_.num_kv_heads);
  Variable v = project(v_proj_, "v_proj", config_.num_kv_heads);
  if (q_norm_) {
    q = tap(ctx, name_, "q_norm", q_norm_->forward(q, ctx));
    k = tap(ctx, name_, "k_norm", k_norm_->forward(k, ctx));
  }
  Tensor positions = ctx.positions;
  if (!positions.defined()) {
    positions = Tensor::arange(0, static_cast<double>(tokens), 1, DType::i64, x.device());
  }
  q = tap(ctx, name_, "q_rotary", ag::rope(q, positions, config_.rope));
  k = tap(ctx, name_, "k_rotary", ag::rope(k, positions, config_.rope));
  const Variable q_heads = ag::transpose(q, 1, 2), k_heads = ag::transpose(k, 1, 2);  // [B, H, T, D]
  AttentionParams params;
  params.window = config_.window;
  params.scale = config_.scale;
  if (ctx.taps) {
    const std::string point = str_cat(name_, ".attn_weights");
    if (ctx.taps->wants(point)) {
      ctx.taps->record(point,
                       microllm::attention_weights(q_heads.value(), k_heads.value(), params, ctx.attention_mask));
    }
  }
  Variable out = ag::attention(q_heads, k_heads, ag::transpose(v, 1, 2), params, ctx.attention_mask);  // [B, Hq, T, D]
  out = tap(ctx, name_, "o_proj.input", ag::reshape(ag::transpose(out, 1, 2), {batch, tokens, config_.num_heads * d}));
  return tap(ctx, name_, "o_proj", o_proj_->forward(out, ctx));
}

Mlp::Mlp(int64_t hidden_size, int64_t intermediate_size, MlpActivation activation, Initializer& init, std::string name)
    : activation_(activation), name_(std::move(name)) {
  gate_proj_ = &register_module("gate_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  up_proj_ = &register_module("up_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  down_proj_ = &register_module("down_proj", std::make_unique<Linear>(intermediate_size, hidden_size, false, init));
  gate_up_ = FusedProjections({gate_proj_, up_proj_});
}

Variable Mlp::forward(const Variable& x, const ForwardContext& ctx) const {
  const Variable gate = tap(ctx, name_, "gate_proj", gate_proj_->forward(x, ctx));
  const Variable up = tap(ctx, name_, "up_proj", up_proj_->forward(x, ctx));
  const Variable hidden = activation_ == MlpActivation::silu
                              ? ag::swiglu(gate, up)
                              : ag::binary(BinaryOp::mul, ag::unary(UnaryOp::gelu_tanh, gate), up);
  return tap(ctx, name_, "", down_proj_->forward(tap(ctx, name_, "down_proj.input", hidden), ctx));
}

DecoderLayer::DecoderLayer(const TransformerConfig& config, int index, Initializer& init)
    : placement_(config.norm_placement), index_(index), name_(str_cat("model.layers.", index)) {
  const AttentionConfig attention = config.attention(index);
  auto norm = [&] { return std::make_unique<RMSNorm>(config.hidden_size, config.rms_norm_eps); };
  input_layernorm_ = &register_module("input_layernorm", norm());
  self_attn_ = &register_module("self_attn", std::make_unique<Attention>(attention, init, name_ + ".self_attn"));
  post_attention_layernorm_ = &register_module("post_attention_layernorm", norm());
  if (placement_ == NormPlacement::sandwich) {
    pre_feedforward_layernorm_ = &register_module("pre_feedforward_layernorm", norm());
    post_feedforward_layernorm_ = &register_module("post_feedforward_layernorm", norm());
  }
  mlp_ = &register_module("mlp", std::make_unique<Mlp>(config.hidden_size, config.intermediate_size,
                                                       config.mlp_activation, init, name_ + ".mlp"));
}

Variable DecoderLayer::forward(const Variable& x, const ForwardContext& ctx) const {
  auto [delta, h] = forward_unsummed(x, Variable(), ctx);
  return tap(ctx, name_, "", ag::add(h, delta));
}

std::pair<Variable, Variable> DecoderLayer::forward_unsummed(const Variable& x, const Variable& residual,
                                                             const ForwardContext& ctx) const {
  const int device = x.device().is_cuda() ? x.device().index : -1;
  profile::Scope span("layer.", index_, ".forward", "layer");
  profile::GpuScope gpu_span("layer.", index_, ".forward", "layer", device);
  Variable normed, stream = x;  // stream: the residual stream entering this block
  if (residual.defined()) {
    std::tie(normed, stream) = input_layernorm_->forward_residual(x, residual, ctx);  // stream = residual + x
  } else {
    normed = input_layernorm_->forward(x, ctx);
  }
  normed = tap(ctx, name_, "input_layernorm", normed);
  Variable attn = self_attn_->forward(normed, ctx);
  // h = stream + delta and norm(h): one fused kernel, or with taps the sum as a point of its own, so that the
  // gradient recorded there is all of h's (the norm's share included).
  auto residual_then_norm = [&](const Variable& delta, const RMSNorm& norm) -> std::pair<Variable, Variable> {
    if (ctx.taps == nullptr) return norm.forward_residual(delta, stream, ctx);
    const Variable h = tap(ctx, name_, "attention_residual", ag::add(stream, delta));
    return {norm.forward(h, ctx), h};
  };
  if (placement_ == NormPlacement::pre) {
    auto [normed2, h] = residual_then_norm(attn, *post_attention_layernorm_);
    return {mlp_->forward(tap(ctx, name_, "post_attention_layernorm", normed2), ctx), h};
  }
  attn = tap(ctx, name_, "post_attention_layernorm", post_attention_layernorm_->forward(attn, ctx));
  auto [normed2, h] = residual_then_norm(attn, *pre_feedforward_layernorm_);
  const Variable mlp = mlp_->forward(tap(ctx, name_, "pre_feedforward_layernorm", normed2), ctx);
  return {tap(ctx, name_, "post_feedforward_layernorm", post_feedforward_layernorm_->forward(mlp, ctx)), h};
}

}  // namespace microllm::nn
