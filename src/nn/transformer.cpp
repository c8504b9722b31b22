#include "microllm/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "microllm/autograd/functions.h"
#include "microllm/backend/rope_math.h"
#include "microllm/nn/taps.h"

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
  MICROLLM_CHECK(!sliding_rope || sliding_rope->theta > 0, ValueError, "config",
                 "the sliding layers' rope_theta must be > 0, got ", sliding_rope ? sliding_rope->theta : 0.0);
  MICROLLM_CHECK(query_pre_attn_scalar >= 0 && embedding_scale > 0 && final_logit_softcap >= 0, ValueError, "config",
                 "query_pre_attn_scalar (", query_pre_attn_scalar, ") and final_logit_softcapping (",
                 final_logit_softcap, ") must be >= 0 and the embedding scale (", embedding_scale, ") > 0");
  MICROLLM_CHECK(sliding_window >= 0, ValueError, "config", "sliding_window must be >= 0 (0: none), got ",
                 sliding_window);
  MICROLLM_CHECK(sliding_layers.empty() || static_cast<int64_t>(sliding_layers.size()) == num_layers, ValueError,
                 "config", "the layer types list ", sliding_layers.size(), " layers, but num_hidden_layers is ",
                 num_layers);
}

int64_t TransformerConfig::context_limit() const {
  const RopeScalingType type = rope.scaling.type;
  if (type != RopeScalingType::longrope && type != RopeScalingType::dynamic) return max_position_embeddings;
  return std::min(max_position_embeddings, rope.scaling.original_max_position_embeddings);
}

int64_t TransformerConfig::window_of(int64_t layer) const {
  if (sliding_window == 0 || sliding_window >= max_position_embeddings) return 0;  // never hides a key
  return sliding_layers.empty() || sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
}

AttentionConfig TransformerConfig::attention(int64_t layer) const {
  const int64_t window = window_of(layer);
  const RopeParams& layer_rope = sliding_rope && window > 0 ? *sliding_rope : rope;
  const double factor = rope_attention_factor(layer_rope.scaling);
  const double base =
      1 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(resolved_head_dim()));
  return AttentionConfig{hidden_size,  num_heads,  num_kv_heads, resolved_head_dim(),   attention_bias, qk_norm,
                         rms_norm_eps, layer_rope, window,       base * factor * factor};
}

double TransformerConfig::embedding_scale_in(DType dtype) const {
  return Tensor::scalar(embedding_scale, dtype).to(DType::f64).item<double>();
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t d = resolved_head_dim(), q = num_heads * d, kv = num_kv_heads * d;
  int64_t layer = hidden_size * (q + 2 * kv) + q * hidden_size                          // q, k, v, o projections
                  + 3 * hidden_size * intermediate_size                                 // gate, up, down
                  + (norm_placement == NormPlacement::sandwich ? 4 : 2) * hidden_size;  // the norms
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
  MemoryCategoryScope memory(MemoryCategory::weights);
  config_.validate();
  Initializer init(seed, config_.initializer_range, random_init);
  auto& model = register_module("model", std::make_unique<Container>());
  embed_tokens_ =
      &model.add("embed_tokens", std::make_unique<Embedding>(config_.vocab_size, config_.hidden_size, init));
  auto& layers = model.add("layers", std::make_unique<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    layers_.push_back(
        &layers.add(std::to_string(i), std::make_unique<DecoderLayer>(config_, static_cast<int>(i), init)));
  }
  norm_ = &model.add("norm", std::make_unique<RMSNorm>(config_.hidden_size, config_.rms_norm_eps));
  if (!config_.tie_word_embeddings) {
    lm_head_ =
        &register_module("lm_head", std::make_unique<Linear>(config_.hidden_size, config_.vocab_size, false, init));
  }
}

Variable TransformerLM::forward(const Tensor& ids, const ForwardContext& context) const {
  MICROLLM_CHECK(ids.dim() == 2, ShapeError, "transformer", "ids must be [B, T], got ", ids.shape());
  ForwardContext ctx = context;
  if (!ctx.positions.defined()) {
    ctx.positions = Tensor::arange(0, static_cast<double>(ids.size(1)), 1, DType::i64, ids.device());
  }
  Variable h, embedded = embed_tokens_->forward(ids, ctx);
  if (config_.embedding_scale != 1) embedded = ag::scale(embedded, config_.embedding_scale_in(ctx.compute_dtype));
  if (ctx.taps) {  // the residual stream summed after each block, so that each block's output is a point
    Taps& taps = *ctx.taps;
    h = taps("model.embed_tokens", embedded);
    for (const DecoderLayer* layer : layers_) h = layer->forward(h, ctx);
    h = taps("model.norm", norm_->forward(h, ctx));
  } else {  // the stream as (delta, residual): each sum is left to the next RMSNorm's fused kernel
    Variable delta = embedded, residual;
    for (const DecoderLayer* layer : layers_) std::tie(delta, residual) = layer->forward_unsummed(delta, residual, ctx);
    h = norm_->forward_residual(delta, residual, ctx).first;
  }
  Variable logits = lm_head_ ? lm_head_->forward(h, ctx)
                             : ag::linear(h, ag::cast(embed_tokens_->weight(), ctx.compute_dtype));  // tied
  if (const double cap = config_.final_logit_softcap; cap > 0)
    logits = ag::scale(ag::tanh(ag::scale(logits, 1 / cap)), cap);
  return ctx.taps ? (*ctx.taps)("logits", logits) : logits;
}

std::vector<Tensor> attention_weights(const TransformerLM& model, const Tensor& ids, const std::vector<int>& layers,
                                      const ForwardContext& context) {
  const int num_layers = static_cast<int>(model.layers().size());
  std::vector<std::string> names;
  for (int layer : layers) {
    MICROLLM_CHECK(layer >= 0 && layer < num_layers, IndexError, "attention_weights", "layer ", layer,
                   " is outside the model's ", num_layers, " layers");
    names.push_back(str_cat("model.layers.", layer, ".self_attn.attn_weights"));
  }
  Taps taps(names);
  ForwardContext ctx = context;
  ctx.taps = &taps;
  {
    autograd::NoGradGuard no_grad;
    model.forward(ids, ctx);
  }
  std::vector<Tensor> weights;
  for (const std::string& name : names) weights.push_back(*taps.value(name));
  return weights;
}

void TransformerLM::fuse_projections() {
  for (DecoderLayer* layer : layers_) layer->fuse_projections();
}

Variable TransformerLM::loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx) const {
  const Variable logits = forward(ids, ctx);
  return ag::cross_entropy(ag::reshape(logits, {-1, config_.vocab_size}), targets.reshape({-1}));
}

}  // namespace microllm::nn
