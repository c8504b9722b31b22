#include "microllm/generate/runner.h"

#include "microllm/autograd/variable.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/indexing.h"
#include "microllm/ops/norm.h"
#include "microllm/profile/trace.h"

namespace microllm::generate {

namespace {

// A parameter in the runner's dtype: the model's own tensor when it has that dtype, else a converted copy.
Tensor in_dtype(const autograd::Variable& parameter, DType dtype) {
  const Tensor& t = parameter.value();
  return t.dtype() == dtype ? t : t.to(dtype);
}

// Projections that read the same input as one weight: the model's joined rows (fuse_projections) when they are
// in the runner's dtype, else the parts concatenated once.
LinearWeight joined(const nn::FusedProjections& group, DType dtype) {
  const nn::FusedProjections::Joined j = group.joined();
  if (j.weight.defined() && j.weight.dtype() == dtype) return LinearWeight::dense(j.weight, j.bias);
  std::vector<Tensor> weights, biases;
  for (const nn::Linear* part : group.parts()) {
    weights.push_back(in_dtype(part->weight(), dtype));
    if (part->bias()) biases.push_back(in_dtype(*part->bias(), dtype));
  }
  return LinearWeight::dense(concat(weights, 0), biases.empty() ? Tensor() : concat(biases, 0));
}

GatedActivation gate_of(nn::MlpActivation activation) {
  return activation == nn::MlpActivation::silu ? GatedActivation::swiglu : GatedActivation::geglu;
}

LinearWeight single(const nn::Linear& linear, DType dtype) {
  return LinearWeight::dense(in_dtype(linear.weight(), dtype),
                             linear.bias() ? in_dtype(*linear.bias(), dtype) : Tensor());
}

}  // namespace

Runner::Runner(const nn::TransformerLM& model, DType dtype) : config_(model.config()), dtype_(dtype) {
  MemoryCategoryScope memory(MemoryCategory::weights);  // weights cast to the compute dtype, decode folds
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f64, DTypeError,
                 "runner", "the compute dtype must be f32, bf16, f16 or f64, got ", dtype);
  embedding_ = in_dtype(model.embed_tokens().weight(), dtype);
  embedding_scale_ = config_.embedding_scale_in(dtype);
  trace_device_ = embedding_.device().is_cuda() ? embedding_.device().index : -1;
  final_norm_ = in_dtype(model.norm().weight(), dtype);
  head_ = model.lm_head() ? single(*model.lm_head(), dtype) : LinearWeight::dense(embedding_);
  for (const nn::DecoderLayer* layer : model.layers()) {
    const nn::Attention& attention = layer->attention();
    Block b;
    b.placement = layer->placement();
    b.eps = layer->input_norm().eps();
    b.input_norm = in_dtype(layer->input_norm().weight(), dtype);
    b.post_attention_norm = in_dtype(layer->post_attention_norm().weight(), dtype);
    if (b.placement == nn::NormPlacement::sandwich) {
      b.pre_feedforward_norm = in_dtype(layer->pre_feedforward_norm()->weight(), dtype);
      b.post_feedforward_norm = in_dtype(layer->post_feedforward_norm()->weight(), dtype);
    }
    b.qkv = joined(attention.qkv(), dtype);
    b.o = single(attention.o_proj(), dtype);
    if (attention.q_norm()) {
      b.qk_norm = {in_dtype(attention.q_norm()->weight(), dtype), in_dtype(attention.k_norm()->weight(), dtype), b.eps};
    }
    b.gate_up = joined(layer->mlp().gate_up(), dtype);
    b.down = single(layer->mlp().down_proj(), dtype);
    b.gate = gate_of(layer->mlp().activation());
    b.rope = attention.config().rope;  // the layer's (Gemma's sliding layers turn by their own base)
    blocks_.push_back(std::move(b));
  }
}

// q, k and v from the fused projection's output qkv [B, T, (Hq + 2 Hkv) D] (views), QK-normed where the family
// says so, attended through the cache and projected by o (+ addend).
Tensor Runner::attention(int index, const Tensor& qkv, const Tensor& addend, AttentionCache& cache) const {
  const Block& b = blocks_[static_cast<size_t>(index)];
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), d = config_.resolved_head_dim();
  const int64_t hq = config_.num_heads, hkv = config_.num_kv_heads;
  const Tensor q = qkv.narrow(2, 0, hq * d).view({batch, tokens, hq, d});
  const Tensor k = qkv.narrow(2, hq * d, hkv * d).view({batch, tokens, hkv, d});
  const Tensor v = qkv.narrow(2, (hq + hkv) * d, hkv * d).view({batch, tokens, hkv, d});
  return cache.attend_projected(index, q, k, v, b.rope, b.qk_norm, b.o, addend);
}

// One block over the residual stream entering it (residual + x'; x' = x, or rms_norm(x, x_norm) where the block
// before still owes its sublayer output's norm; x' alone when residual is undefined). Returns (delta, residual) of
// the stream after it. Each RMSNorm and the projection after it are one op (a CUDA decode layer is five kernels),
// the gate included, and so is a sandwich block's sublayer output norm: the next norm_linear takes it as its
// x_norm (the MLP's of this block; the attention's of the next, whose x_norm this block's post-feedforward norm
// is). In pre-norm blocks the residual adds ride in the projection before them (o, down: one rounding where Hugging
// Face rounds twice), except the attention's where the backend folds the MLP's RMSNorm into gate_up's kernel (then
// it adds it there while it stages its input): then delta is the whole output and the residual undefined.
std::pair<Tensor, Tensor> Runner::block(int index, const Tensor& x, const Tensor& x_norm, const Tensor& residual,
                                        AttentionCache& cache) const {
  const Block& b = blocks_[static_cast<size_t>(index)];
  const bool pre = b.placement == nn::NormPlacement::pre;
  const bool add_in_o = pre && !b.gate_up.folds_norm(x.numel() / x.size(-1), b.gate);
  profile::Scope span("layer.", index, "", "layer");
  profile::GpuScope gpu_span("layer.", index, "", "layer", trace_device_);
  Tensor attn, stream;
  {
    profile::Scope attention_span("layer.", index, ".attention", "layer");
    NormLinearResult qkv = b.qkv.norm_linear(x, residual, b.input_norm, b.eps, GatedActivation::none, x_norm);
    stream = std::move(qkv.h);
    attn = attention(index, qkv.out, add_in_o ? stream : Tensor(), cache);
  }
  profile::Scope mlp_span("layer.", index, ".mlp", "layer");
  if (pre) {
    auto [activation, h] =
        b.gate_up.norm_linear(attn, add_in_o ? Tensor() : stream, b.post_attention_norm, b.eps, b.gate);
    return {b.down.linear(activation, h), Tensor()};
  }
  auto [activation, h] =
      b.gate_up.norm_linear(attn, stream, b.pre_feedforward_norm, b.eps, b.gate, b.post_attention_norm);
  return {b.down.linear(activation), h};  // the delta still owes b.post_feedforward_norm
}

std::pair<Tensor, Tensor> Runner::layers(const Tensor& ids, AttentionCache& cache) const {
  MemoryCategoryScope memory(MemoryCategory::activations);
  MICROLLM_CHECK(ids.dim() == 2, ShapeError, "runner", "ids must be [B, T], got ", ids.shape());
  Tensor delta = embedding(embedding_, ids), residual;
  if (embedding_scale_ != 1) delta = scale(delta, embedding_scale_);
  Tensor owed_norm;  // the norm delta still owes before its add: a sandwich block's post-feedforward norm
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::tie(delta, residual) = block(static_cast<int>(i), delta, owed_norm, residual, cache);
    owed_norm = blocks_[i].post_feedforward_norm;  // undefined in pre-norm blocks
  }
  if (owed_norm.defined()) delta = rms_norm(delta, owed_norm, blocks_.back().eps);
  return {delta, residual};
}

void Runner::fill(const Tensor& ids, AttentionCache& cache) const {
  autograd::NoGradGuard no_grad;
  layers(ids, cache);
  cache.finish_forward(ids.size(1));
}

Tensor Runner::forward(const Tensor& ids, AttentionCache& cache, const LogitRows& rows) const {
  autograd::NoGradGuard no_grad;
  MemoryCategoryScope memory(MemoryCategory::activations);
  auto [delta, residual] = layers(ids, cache);
  const int64_t batch = ids.size(0), tokens = ids.size(1);
  if (rows.kind == LogitRows::Kind::chosen) {
    MICROLLM_CHECK(rows.rows.dim() == 1 && rows.rows.size(0) == batch, ShapeError, "runner",
                   "the chosen rows must be [B] (one row per sequence), got ", rows.rows.shape(), " for ids ",
                   ids.shape());
    const auto row = [&](const Tensor& v) {  // rows of a [B * T, width] table gathered by device index
      const int64_t width = v.size(-1);
      return embedding(v.reshape({batch * tokens, width}), rows.rows).reshape({batch, 1, width});
    };
    delta = row(delta);
    if (residual.defined()) residual = row(residual);
  } else if (rows.kind == LogitRows::Kind::last && tokens > 1) {
    delta = delta.narrow(1, tokens - 1, 1);
    if (residual.defined()) residual = residual.narrow(1, tokens - 1, 1);
  }
  const Tensor h = residual.defined() ? rms_norm_residual(delta, residual, final_norm_, config_.rms_norm_eps).out
                                      : rms_norm(delta, final_norm_, config_.rms_norm_eps);
  cache.finish_forward(tokens);
  const Tensor logits = head_.linear(h);
  const double cap = config_.final_logit_softcap;
  return cap > 0 ? scale(tanh(scale(logits, 1 / cap)), cap) : logits;
}

}  // namespace microllm::generate
