#include "microllm/nn/transformer.h"

#include <tuple>

#include "microllm/autograd/functions.h"
#include "microllm/nn/paged_kv_cache.h"
#include "microllm/ops/indexing.h"

namespace microllm::nn {

namespace ag = autograd;

void TransformerConfig::validate() const {
  auto positive = [](int64_t v, const char* field) {
    MICROLLM_CHECK(v > 0, ValueError, "config", field, " must be > 0, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  MICROLLM_CHECK(num_heads % num_kv_heads == 0, ValueError, "config", "num_attention_heads (", num_heads,
                 ") must be a multiple of num_key_value_heads (", num_kv_heads, ")");
  MICROLLM_CHECK(head_dim > 0 || hidden_size % num_heads == 0, ValueError, "config", "hidden_size (", hidden_size,
                 ") is not a multiple of num_attention_heads (", num_heads, ") and head_dim is not set");
  MICROLLM_CHECK(resolved_head_dim() % 2 == 0, ValueError, "config", "head_dim must be even for RoPE, got ",
                 resolved_head_dim());
  MICROLLM_CHECK(rms_norm_eps > 0, ValueError, "config", "rms_norm_eps must be > 0, got ", rms_norm_eps);
  MICROLLM_CHECK(rope.theta > 0, ValueError, "config", "rope_theta must be > 0, got ", rope.theta);
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t d = resolved_head_dim(), q = num_heads * d, kv = num_kv_heads * d;
  int64_t layer = hidden_size * (q + 2 * kv) + q * hidden_size   // q, k, v, o projections
                  + 3 * hidden_size * intermediate_size           // gate, up, down
                  + 2 * hidden_size;                              // the two norms
  if (attention_bias) layer += q + 2 * kv;
  if (qk_norm) layer += 2 * d;
  const int64_t embeddings = vocab_size * hidden_size;
  return embeddings + num_layers * layer + hidden_size + (tie_word_embeddings ? 0 : embeddings);
}

TransformerConfig TransformerConfig::preset(const std::string& name, int64_t vocab_size) {
  TransformerConfig c;
  c.vocab_size = vocab_size;
  c.rope.theta = 10000;
  c.max_position_embeddings = 2048;
  if (name == "tiny") {  // ~1.0M parameters at a byte vocabulary
    c.hidden_size = 128, c.num_layers = 5, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 384;
  } else if (name == "model-s") {  // ~15M
    c.hidden_size = 384, c.num_layers = 9, c.num_heads = 6, c.num_kv_heads = 2, c.intermediate_size = 1024;
  } else if (name == "model-m") {  // ~50M
    c.hidden_size = 640, c.num_layers = 12, c.num_heads = 10, c.num_kv_heads = 2, c.intermediate_size = 1792;
  } else {
    throw ValueError("config", str_cat("unknown preset '", name, "' (have tiny, model-s, model-m)"));
  }
  return c;
}

KvCache::KvCache(const TransformerConfig& config, int64_t batch, int64_t max_tokens, DType dtype, Device device)
    : capacity_(max_tokens) {
  const Shape shape{batch, config.num_kv_heads, max_tokens, config.resolved_head_dim()};
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    keys_.push_back(Tensor::empty(shape, dtype, device));
    values_.push_back(Tensor::empty(shape, dtype, device));
  }
}

std::pair<Tensor, Tensor> KvCache::append(int layer, const Tensor& k, const Tensor& v) {
  MICROLLM_CHECK(layer >= 0 && layer < static_cast<int>(keys_.size()), IndexError, "kv_cache", "layer ", layer,
                 " out of range");
  const int64_t tokens = k.size(1);
  MICROLLM_CHECK(length_ + tokens <= capacity_, ValueError, "kv_cache", "appending ", tokens, " tokens to ", length_,
                 " exceeds the capacity of ", capacity_);
  keys_[layer].narrow(2, length_, tokens).copy_(k.transpose(1, 2));
  values_[layer].narrow(2, length_, tokens).copy_(v.transpose(1, 2));
  return {keys_[layer].narrow(2, 0, length_ + tokens), values_[layer].narrow(2, 0, length_ + tokens)};
}

void KvCache::advance(int64_t tokens) { length_ += tokens; }

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const Tensor& t : keys_) total += 2 * t.nbytes();
  return total;
}

PagedKvCache::PagedKvCache(const TransformerConfig& config, int64_t num_blocks, int64_t block_size, DType dtype,
                           Device device)
    : num_blocks_(num_blocks), block_size_(block_size) {
  MICROLLM_CHECK(num_blocks >= 1 && block_size >= 1, ValueError, "paged_kv_cache", "needs at least one block of ",
                 "at least one token, got ", num_blocks, " blocks of ", block_size);
  const Shape shape{num_blocks, block_size, config.num_kv_heads, config.resolved_head_dim()};
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    keys_.push_back(Tensor::empty(shape, dtype, device));
    values_.push_back(Tensor::empty(shape, dtype, device));
  }
}

size_t PagedKvCache::bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < keys_.size(); ++i) total += keys_[i].nbytes() + values_[i].nbytes();
  return total;
}

size_t PagedKvCache::block_bytes(const TransformerConfig& config, int64_t block_size, DType dtype) {
  return 2 * static_cast<size_t>(config.num_layers * block_size * config.num_kv_heads * config.resolved_head_dim()) *
         dtype_size(dtype);
}

namespace {
// A plain container, so names nest as Hugging Face's do ("model.layers.3...").
class Container : public Module {
 public:
  template <typename M>
  M& add(const std::string& name, std::unique_ptr<M> module) {
    return register_module(name, std::move(module));
  }
};
}  // namespace

TransformerLM::TransformerLM(const TransformerConfig& config, uint64_t seed, bool random_init) : config_(config) {
  config_.validate();
  Initializer init(seed, config_.initializer_range, random_init);
  auto& model = register_module("model", std::make_unique<Container>());
  embed_tokens_ = &model.add("embed_tokens", std::make_unique<Embedding>(config_.vocab_size, config_.hidden_size, init));
  auto& layers = model.add("layers", std::make_unique<Container>());
  const AttentionConfig attention{config_.hidden_size, config_.num_heads,       config_.num_kv_heads,
                                  config_.resolved_head_dim(), config_.attention_bias, config_.qk_norm,
                                  config_.rms_norm_eps, config_.rope};
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    layers_.push_back(&layers.add(std::to_string(i), std::make_unique<DecoderLayer>(
                                                         attention, config_.intermediate_size, static_cast<int>(i), init)));
  }
  norm_ = &model.add("norm", std::make_unique<RMSNorm>(config_.hidden_size, config_.rms_norm_eps));
  if (!config_.tie_word_embeddings) {
    lm_head_ = &register_module("lm_head", std::make_unique<Linear>(config_.hidden_size, config_.vocab_size, false, init));
  }
}

std::pair<Variable, Variable> TransformerLM::run_layers(const Tensor& ids, ForwardContext& ctx) const {
  MICROLLM_CHECK(ids.dim() == 2, ShapeError, "transformer", "ids must be [B, T], got ", ids.shape());
  const int64_t tokens = ids.size(1);
  if (!ctx.positions.defined()) {
    const int64_t start = ctx.cache ? ctx.cache->length() : 0;
    ctx.positions = Tensor::arange(static_cast<double>(start), static_cast<double>(start + tokens), 1, DType::i64,
                                   ids.device());
  }
  Variable delta = embed_tokens_->forward(ids, ctx), residual;
  for (const DecoderLayer* layer : layers_) std::tie(delta, residual) = layer->forward_unsummed(delta, residual, ctx);
  return {delta, residual};
}

void TransformerLM::fill_cache(const Tensor& ids, const ForwardContext& context) const {
  MICROLLM_CHECK(context.cache || context.paged, ValueError, "transformer",
                 "fill_cache keeps only the k/v: give it a KV cache (ctx.cache or ctx.paged)");
  ForwardContext ctx = context;
  run_layers(ids, ctx);
  if (ctx.cache) ctx.cache->advance(ids.size(1));
}

Variable TransformerLM::forward(const Tensor& ids, const ForwardContext& context) const {
  ForwardContext ctx = context;
  auto [delta, residual] = run_layers(ids, ctx);
  const int64_t tokens = ids.size(1);
  if (ctx.last_logits_only && ctx.last_row.defined()) {  // rows chosen on the device
    const int64_t batch = ids.size(0);
    MICROLLM_CHECK(!autograd::grad_enabled(), ValueError, "transformer", "last_row is for inference: use a NoGradGuard");
    MICROLLM_CHECK(ctx.last_row.dim() == 1 && ctx.last_row.size(0) == batch, ShapeError, "transformer",
                   "last_row must be [B] (one row per sequence), got ", ctx.last_row.shape(), " for ids ", ids.shape());
    const auto row = [&](const Variable& v) {  // embedding(): rows of a [B * T, width] table gathered by device index
      const int64_t width = v.value().size(-1);
      return Variable(
          embedding(v.value().reshape({batch * tokens, width}), ctx.last_row).reshape({batch, 1, width}));
    };
    delta = row(delta);
    if (residual.defined()) residual = row(residual);
  } else if (ctx.last_logits_only && tokens > 1) {  // generation needs no more
    delta = ag::narrow(delta, 1, tokens - 1, 1);
    if (residual.defined()) residual = ag::narrow(residual, 1, tokens - 1, 1);
  }
  // No residual after fused layers: they add it in their last projection (DecoderLayer::forward_unsummed).
  Variable h = residual.defined() ? norm_->forward_residual(delta, residual, ctx).first : norm_->forward(delta, ctx);
  if (ctx.cache) ctx.cache->advance(tokens);
  if (lm_head_) return lm_head_->forward(h, ctx);
  return ag::linear(h, ag::cast(embed_tokens_->weight(), ctx.compute_dtype));  // tied head
}

void TransformerLM::fuse_projections() {
  for (DecoderLayer* layer : layers_) layer->fuse_projections();
}

Variable TransformerLM::loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx) const {
  const Variable logits = forward(ids, ctx);
  return ag::cross_entropy(ag::reshape(logits, {-1, config_.vocab_size}), targets.reshape({-1}));
}

}  // namespace microllm::nn
