#include "microllm/generate/kv_cache.h"

#include "microllm/autograd/variable.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/paged_attention.h"
#include "microllm/ops/qk_norm.h"
#include "microllm/ops/rope.h"

namespace microllm::generate {

namespace {

void check_inference(const char* op) {
  MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, op, "a KV cache is for inference: use a NoGradGuard");
}

// q [B, T, Hq, D] and k [B, T, Hkv, D] as one [B, T, Hq + Hkv, D] view when k's heads follow q's in one buffer (the
// runner's fused qkv projection): then one rotary call turns both. Undefined otherwise.
Tensor adjacent_heads(const Tensor& q, const Tensor& k) {
  if (!q.shares_storage_with(k) || q.dtype() != k.dtype() || q.strides() != k.strides() || q.stride(3) != 1 ||
      q.stride(2) != q.size(3) || k.offset() != q.offset() + q.size(2) * q.stride(2)) {
    return Tensor();
  }
  return Tensor(q.storage(), {q.size(0), q.size(1), q.size(2) + k.size(2), q.size(3)}, q.strides(), q.offset(),
                q.dtype());
}

}  // namespace

std::vector<LayerAttention> layer_attention(const nn::TransformerConfig& config) {
  std::vector<LayerAttention> layers;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const nn::AttentionConfig a = config.attention(layer);
    layers.push_back({a.window, a.scale});
  }
  return layers;
}

Tensor AttentionCache::attend_projected(int layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const RopeParams& rope, const QkNormParams& qk_norm, const LinearWeight& o,
                                        const Tensor& addend) {
  if (!qk_norm.defined()) return o.linear(attend(layer, q, k, v, rope), addend);
  const auto [q_normed, k_normed] = qk_rms_norm(q, k, qk_norm.q_weight, qk_norm.k_weight, qk_norm.eps);
  return o.linear(attend(layer, q_normed, k_normed, v, rope), addend);
}

// ---- contiguous ----

ContiguousKvCache::ContiguousKvCache(const nn::TransformerConfig& config, int64_t batch, int64_t capacity, DType dtype,
                                     Device device)
    : capacity_(capacity) {
  MemoryCategoryScope memory(MemoryCategory::kv_cache);
  const Shape shape{batch, config.num_kv_heads, capacity, config.resolved_head_dim()};
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    keys_.push_back(Tensor::empty(shape, dtype, device));
    values_.push_back(Tensor::empty(shape, dtype, device));
  }
  layers_ = layer_attention(config);
}

size_t ContiguousKvCache::bytes() const {
  size_t total = 0;
  for (const Tensor& t : keys_) total += 2 * t.nbytes();
  return total;
}

Tensor ContiguousKvCache::attend(int layer, const Tensor& q_in, const Tensor& k_in, const Tensor& v,
                                 const RopeParams& rope_params) {
  check_inference("kv_cache");
  MICROLLM_CHECK(layer >= 0 && layer < static_cast<int>(keys_.size()), IndexError, "kv_cache", "layer ", layer,
                 " out of range");
  const int64_t batch = q_in.size(0), tokens = q_in.size(1), hq = q_in.size(2), d = q_in.size(3);
  MICROLLM_CHECK(length_ + tokens <= capacity_, ValueError, "kv_cache", "appending ", tokens, " tokens to ", length_,
                 " exceeds the capacity of ", capacity_);
  const Tensor positions = positions_.defined()
                               ? positions_
                               : Tensor::arange(static_cast<double>(length_), static_cast<double>(length_ + tokens), 1,
                                                DType::i64, q_in.device());
  Tensor q, k;
  if (const Tensor qk = adjacent_heads(q_in, k_in); qk.defined()) {
    const Tensor turned = microllm::rope(qk, positions, rope_params);
    q = turned.narrow(2, 0, hq);
    k = turned.narrow(2, hq, k_in.size(2));
  } else {
    q = microllm::rope(q_in, positions, rope_params);
    k = microllm::rope(k_in, positions, rope_params);
  }
  const auto at = static_cast<size_t>(layer);
  keys_[at].narrow(2, length_, tokens).copy_(k.transpose(1, 2));
  values_[at].narrow(2, length_, tokens).copy_(v.transpose(1, 2));
  const int64_t keys = length_ + tokens;
  AttentionParams params;
  params.q_offset = length_;
  params.window = layers_[at].window;
  params.scale = layers_[at].scale;
  const Tensor mask = key_mask_.defined() ? key_mask_.narrow(3, 0, keys) : Tensor();
  const Tensor out =
      microllm::attention(q.transpose(1, 2), keys_[at].narrow(2, 0, keys), values_[at].narrow(2, 0, keys), params, mask)
          .out;  // [B, Hq, T, D]
  return out.transpose(1, 2).reshape({batch, tokens, hq * d});
}

void ContiguousKvCache::finish_forward(int64_t tokens) {
  length_ += tokens;
  positions_ = Tensor();
}

// ---- paged ----

PagedKvCache::PagedKvCache(const nn::TransformerConfig& config, int64_t num_blocks, int64_t block_size, DType dtype,
                           Device device)
    : num_blocks_(num_blocks), block_size_(block_size) {
  MemoryCategoryScope memory(MemoryCategory::kv_cache);
  MICROLLM_CHECK(num_blocks >= 1 && block_size >= 1, ValueError, "paged_kv_cache", "needs at least one block of ",
                 "at least one token, got ", num_blocks, " blocks of ", block_size);
  const Shape shape{num_blocks, block_size, config.num_kv_heads, config.resolved_head_dim()};
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    keys_.push_back(Tensor::empty(shape, dtype, device));
    values_.push_back(Tensor::empty(shape, dtype, device));
  }
  layers_ = layer_attention(config);
}

size_t PagedKvCache::bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < keys_.size(); ++i) total += keys_[i].nbytes() + values_[i].nbytes();
  return total;
}

size_t PagedKvCache::block_bytes(const nn::TransformerConfig& config, int64_t block_size, DType dtype) {
  return 2 * static_cast<size_t>(config.num_layers * block_size * config.num_kv_heads * config.resolved_head_dim()) *
         dtype_size(dtype);
}

Tensor PagedDecode::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope) {
  check_inference("paged_decode");
  const int64_t batch = q.size(0);
  MICROLLM_CHECK(q.size(1) == 1, ShapeError, "paged_decode", "a decode step takes one token per row, got ", q.size(1));
  const Tensor out = Tensor::empty({batch, q.size(2), q.size(3)}, q.dtype(), q.device());
  paged_decode_attention(q.select(1, 0), k.select(1, 0), v.select(1, 0), rope, cache_.keys(layer), cache_.values(layer),
                         in_.slots, in_.block_tables, in_.seq_ids, in_.positions, cache_.attention(layer).scale,
                         in_.max_context, out, cache_.attention(layer).window);
  return out.reshape({batch, 1, q.size(2) * q.size(3)});
}

Tensor PagedDecode::attend_projected(int layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const RopeParams& rope, const QkNormParams& qk_norm, const LinearWeight& o,
                                     const Tensor& addend) {
  const Tensor o_matrix = o.dense_matrix();
  if (!o_matrix.defined() || o.bias().defined())
    return AttentionCache::attend_projected(layer, q, k, v, rope, qk_norm, o, addend);
  check_inference("paged_decode");
  const int64_t batch = q.size(0), hidden = o.out_features();
  MICROLLM_CHECK(q.size(1) == 1, ShapeError, "paged_decode", "a decode step takes one token per row, got ", q.size(1));
  const Tensor out = Tensor::empty({batch, hidden}, q.dtype(), q.device());
  paged_decode_attention_projected(
      q.select(1, 0), k.select(1, 0), v.select(1, 0), rope, cache_.keys(layer), cache_.values(layer), in_.slots,
      in_.block_tables, in_.seq_ids, in_.positions, cache_.attention(layer).scale, in_.max_context, o_matrix,
      addend.defined() ? addend.reshape({batch, hidden}) : Tensor(), out, cache_.attention(layer).window, qk_norm);
  return out.reshape({batch, 1, hidden});
}

Tensor PagedPrefill::attend(int layer, const Tensor& q_in, const Tensor& k_in, const Tensor& v,
                            const RopeParams& rope) {
  check_inference("paged_prefill");
  const int64_t batch = q_in.size(0), tokens = q_in.size(1), hq = q_in.size(2), hkv = k_in.size(2), d = q_in.size(3);
  const Tensor& k_pool = cache_.keys(layer);
  const Tensor& v_pool = cache_.values(layer);
  MICROLLM_CHECK(batch == 1 || in_.chunk_start == 0, ShapeError, "paged_prefill",
                 "a batch of prefill chunks holds whole prompts (chunk start 0), got a batch of ", batch,
                 " at chunk start ", in_.chunk_start);
  const auto [q, k] = paged_rope_kv_write(q_in, k_in, v, in_.positions, rope, k_pool, v_pool, in_.slots);
  // Flash attention over the sequence's earlier keys (from its blocks) and the chunk's own.
  Tensor keys = k, values = v;  // [1, S, Hkv, D]
  if (in_.chunk_start > 0) {
    const Tensor row = in_.block_tables.select(0, in_.chunk_row);
    const int64_t length = in_.chunk_start + tokens;
    keys = paged_gather(k_pool, row, length).reshape({1, length, hkv, d});
    values = paged_gather(v_pool, row, length).reshape({1, length, hkv, d});
  }
  AttentionParams params;
  params.q_offset = in_.chunk_start;
  params.window = cache_.attention(layer).window;
  params.scale = cache_.attention(layer).scale;
  const Tensor out = microllm::attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), params).out;
  return out.transpose(1, 2).reshape({batch, tokens, hq * d});
}

}  // namespace microllm::generate
