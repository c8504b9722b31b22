#include "microllm/nn/layers.h"

#include <cmath>
#include <tuple>

#include "microllm/autograd/functions.h"
#include "microllm/nn/paged_kv_cache.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/activation.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/norm_linear.h"
#include "microllm/ops/paged_attention.h"
#include "microllm/ops/rope.h"

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

Variable Linear::forward(const Variable& x, const ForwardContext& ctx, const Tensor& addend) const {
  if (!addend.defined()) return ag::linear(x, as_compute(*weight_, ctx), bias_ ? as_compute(*bias_, ctx) : Variable());
  MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, "linear",
                 "an addend (the residual in the epilogue) is for inference: use a NoGradGuard");
  return Variable(linear_add(x.value(), as_compute(*weight_, ctx).value(),
                             bias_ ? as_compute(*bias_, ctx).value() : Tensor(), addend));
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

FusedProjections::Joined FusedProjections::joined(const ForwardContext& ctx) const {
  if (parts_.empty() || autograd::grad_enabled()) return {};
  std::vector<const Tensor*> weights, biases;
  for (Linear* part : parts_) {
    weights.push_back(&part->weight().value());
    if (part->bias()) biases.push_back(&part->bias()->value());
  }
  if (weights.front()->dtype() != ctx.compute_dtype) return {};
  Joined fused{joined_rows(weights), biases.empty() ? Tensor() : joined_rows(biases)};
  if (!fused.weight.defined() || (!biases.empty() && !fused.bias.defined())) return {};
  return fused;
}

Tensor FusedProjections::forward(const Tensor& x, const ForwardContext& ctx) const {
  const Joined fused = joined(ctx);
  return fused.weight.defined() ? linear(x, fused.weight, fused.bias) : Tensor();
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

Tensor RMSNorm::weight_for(const ForwardContext& ctx) const { return as_compute(*weight_, ctx).value(); }

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
  qkv_ = FusedProjections({q_proj_, k_proj_, v_proj_});
  if (config.qk_norm) {
    q_norm_ = &register_module("q_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
    k_norm_ = &register_module("k_norm", std::make_unique<RMSNorm>(config.head_dim, config.rms_norm_eps));
  }
}

Variable Attention::forward(const Variable& x, const ForwardContext& ctx) const {
  // [B, T, (Hq + 2 Hkv) D] when fused (inference), else undefined
  if (const Tensor qkv = qkv_.forward(x.value(), ctx); qkv.defined()) return forward_qkv(qkv, ctx);
  const int64_t batch = x.size(0), tokens = x.size(1), d = config_.head_dim;
  Variable q = ag::reshape(q_proj_->forward(x, ctx), {batch, tokens, config_.num_heads, d});     // [B, T, Hq, D]
  Variable k = ag::reshape(k_proj_->forward(x, ctx), {batch, tokens, config_.num_kv_heads, d});  // [B, T, Hkv, D]
  Variable v = ag::reshape(v_proj_->forward(x, ctx), {batch, tokens, config_.num_kv_heads, d});
  return attend(q, k, v, Tensor(), ctx);
}

Variable Attention::forward_qkv(const Tensor& qkv, const ForwardContext& ctx, const Tensor& residual) const {
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), d = config_.head_dim;
  const int64_t hq = config_.num_heads, hkv = config_.num_kv_heads;
  return attend(Variable(qkv.narrow(2, 0, hq * d).view({batch, tokens, hq, d})),
                Variable(qkv.narrow(2, hq * d, hkv * d).view({batch, tokens, hkv, d})),
                Variable(qkv.narrow(2, (hq + hkv) * d, hkv * d).view({batch, tokens, hkv, d})), qkv, ctx, residual);
}

Variable Attention::attend(Variable q, Variable k, Variable v, const Tensor& qkv, const ForwardContext& ctx,
                           const Tensor& residual) const {
  const int64_t batch = q.size(0), tokens = q.size(1), d = config_.head_dim;
  const int64_t hq = config_.num_heads, hkv = config_.num_kv_heads;
  if (q_norm_) {
    q = q_norm_->forward(q, ctx);
    k = k_norm_->forward(k, ctx);
  }
  if (ctx.paged && ctx.paged->chunk_start < 0) {  // decode: rotary, cache write, attention and o in one op
    return Variable(paged_decode(q.value(), k.value(), v.value(), *ctx.paged,
                                 as_compute(o_proj_->weight(), ctx).value(), residual));
  }
  if (ctx.paged) return o_proj_->forward(Variable(paged_prefill(q.value(), k.value(), v.value(), ctx)), ctx, residual);
  if (qkv.defined() && !q_norm_) {  // q and k heads are adjacent in the fused output: one rotary call turns both
    const Tensor qk = rope(qkv.narrow(2, 0, (hq + hkv) * d).view({batch, tokens, hq + hkv, d}), ctx.positions,
                           config_.rope);
    q = Variable(qk.narrow(2, 0, hq));
    k = Variable(qk.narrow(2, hq, hkv));
  } else {
    q = ag::rope(q, ctx.positions, config_.rope);
    k = ag::rope(k, ctx.positions, config_.rope);
  }
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
  return o_proj_->forward(out, ctx, residual);
}

// q [B, 1, Hq, D], k and v [B, 1, Hkv, D] before the rotary embedding, one new token per sequence ->
// [B, 1, hidden] = residual + attention @ o_weight^T (residual may be undefined); their k/v written to the paged
// cache. The rotary position of row b is query_positions[b].
Tensor Attention::paged_decode(const Tensor& q, const Tensor& k, const Tensor& v, const PagedBatch& paged,
                               const Tensor& o_weight, const Tensor& residual) const {
  MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, "attention", "the KV cache is for inference: use a NoGradGuard");
  const int64_t batch = q.size(0), hidden = o_weight.size(0);
  MICROLLM_CHECK(q.size(1) == 1, ShapeError, "attention", "a paged decode step takes one token per row, got ",
                 q.size(1));
  const Tensor out = Tensor::empty({batch, hidden}, q.dtype(), q.device());
  paged_decode_attention_projected(q.select(1, 0), k.select(1, 0), v.select(1, 0), config_.rope,
                                   paged.cache->keys(layer_index_), paged.cache->values(layer_index_), paged.slots,
                                   paged.block_tables, paged.seq_ids, paged.query_positions, 0, paged.max_context,
                                   o_weight, residual.defined() ? residual.reshape({batch, hidden}) : Tensor(), out);
  return out.reshape({batch, 1, hidden});
}

// q [B, T, Hq, D], k and v [B, T, Hkv, D] of a prefill chunk before the rotary embedding -> [B, T, Hq * D]; the
// rotary embedding and the cache write of k and v in one op, then attention over the chunk's keys and earlier ones.
// B > 1: whole prompts (chunk_start 0), each row one sequence's, right-padded (slots -1): causal attention keeps
// the padding out of the rows before it.
Tensor Attention::paged_prefill(const Tensor& q_in, const Tensor& k_in, const Tensor& v, const ForwardContext& ctx) const {
  MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, "attention", "the KV cache is for inference: use a NoGradGuard");
  const PagedBatch& paged = *ctx.paged;
  const int64_t batch = q_in.size(0), tokens = q_in.size(1), d = config_.head_dim;
  const Tensor& k_pool = paged.cache->keys(layer_index_);
  const Tensor& v_pool = paged.cache->values(layer_index_);
  MICROLLM_CHECK(batch == 1 || paged.chunk_start == 0, ShapeError, "attention",
                 "a batch of prefill chunks holds whole prompts (chunk start 0), got a batch of ", batch,
                 " at chunk start ", paged.chunk_start);
  const auto [q, k] = paged_rope_kv_write(q_in, k_in, v, ctx.positions, config_.rope, k_pool, v_pool, paged.slots);
  // Flash attention over the sequence's earlier keys (from its blocks) and the chunk's own.
  Tensor keys = k, values = v;  // [1, S, Hkv, D]
  if (paged.chunk_start > 0) {
    const Tensor row = paged.block_tables.select(0, paged.chunk_row);
    const int64_t length = paged.chunk_start + tokens;
    keys = paged_gather(k_pool, row, length).reshape({1, length, config_.num_kv_heads, d});
    values = paged_gather(v_pool, row, length).reshape({1, length, config_.num_kv_heads, d});
  }
  AttentionParams params;
  params.q_offset = paged.chunk_start;
  const Tensor out = microllm::attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), params).out;
  return out.transpose(1, 2).reshape({batch, tokens, config_.num_heads * d});
}

Mlp::Mlp(int64_t hidden_size, int64_t intermediate_size, Initializer& init) {
  gate_proj_ = &register_module("gate_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  up_proj_ = &register_module("up_proj", std::make_unique<Linear>(hidden_size, intermediate_size, false, init));
  down_proj_ = &register_module("down_proj", std::make_unique<Linear>(intermediate_size, hidden_size, false, init));
  gate_up_ = FusedProjections({gate_proj_, up_proj_});
}

Variable Mlp::down(const Variable& activation, const ForwardContext& ctx, const Tensor& residual) const {
  return down_proj_->forward(activation, ctx, residual);
}

Variable Mlp::forward(const Variable& x, const ForwardContext& ctx) const {
  if (const Tensor gate_up = gate_up_.forward(x.value(), ctx); gate_up.defined()) {  // [.., 2 * intermediate]
    const int64_t n = gate_up.size(-1) / 2;
    return down_proj_->forward(Variable(swiglu(gate_up.narrow(-1, 0, n), gate_up.narrow(-1, n, n))), ctx);
  }
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
  auto [mlp_out, h] = forward_unsummed(x, Variable(), ctx);
  return h.defined() ? ag::add(h, mlp_out) : mlp_out;  // forward_fused added h in the down projection
}

std::pair<Variable, Variable> DecoderLayer::forward_fused(const Variable& x, const Variable& residual,
                                                          const ForwardContext& ctx) const {
  const FusedProjections::Joined qkv = self_attn_->qkv_projections().joined(ctx);
  const FusedProjections::Joined gate_up = mlp_->gate_up_projections().joined(ctx);
  if (!qkv.weight.defined() || !gate_up.weight.defined() || gate_up.bias.defined()) return {};
  // The residual adds ride in the epilogue of the projection before them (o, down: linear_add), so that the
  // RMSNorm after reads one tensor instead of two, except the attention's where the backend folds the MLP's
  // RMSNorm into gate_up's kernel (CUDA's decode GEMV, which then adds it while it stages its input). Measured on
  // the H200 (docs/perf/inference.md): the MLP's add in down's epilogue made batch-1 decode 1-3% faster for
  // both models; the attention's in o's epilogue made Qwen2.5-0.5B's (folded gate_up) 1-2% slower.
  const int64_t rows = x.value().numel() / x.size(-1);
  const bool add_in_o = !rms_norm_linear_folds(rows, gate_up.weight, /*swiglu=*/true);
  // stream: the residual stream entering the layer (residual + x; x itself after a fused layer, which adds it);
  // h: after the attention's residual add.
  const Tensor res = residual.defined() ? residual.value() : Tensor();
  const auto [qkv_out, stream] = rms_norm_linear(x.value(), res, input_layernorm_->weight_for(ctx),
                                                 input_layernorm_->eps(), qkv.weight, qkv.bias, /*swiglu=*/false);
  const Tensor attn = self_attn_->forward_qkv(qkv_out, ctx, add_in_o ? stream : Tensor()).value();
  const auto [activation, h] =
      rms_norm_linear(attn, add_in_o ? Tensor() : stream, post_attention_layernorm_->weight_for(ctx),
                      post_attention_layernorm_->eps(), gate_up.weight, Tensor(), /*swiglu=*/true);
  return {mlp_->down(Variable(activation), ctx, h), Variable()};
}

std::pair<Variable, Variable> DecoderLayer::forward_unsummed(const Variable& x, const Variable& residual,
                                                             const ForwardContext& ctx) const {
  if (auto fused = forward_fused(x, residual, ctx); fused.first.defined()) return fused;
  Variable normed, stream = x;  // stream: the residual stream entering this layer
  if (residual.defined()) {
    std::tie(normed, stream) = input_layernorm_->forward_residual(x, residual, ctx);  // stream = residual + x
  } else {
    normed = input_layernorm_->forward(x, ctx);
  }
  const Variable attn = self_attn_->forward(normed, ctx);
  auto [normed2, h] = post_attention_layernorm_->forward_residual(attn, stream, ctx);  // h = stream + attn
  return {mlp_->forward(normed2, ctx), h};
}

}  // namespace microllm::nn
