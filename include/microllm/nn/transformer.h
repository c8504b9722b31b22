// A decoder-only language model (Llama / Qwen2 / Qwen3 / Mistral family and any block a family describes) as the
// training graph: one forward, which autograd differentiates and which inference (generate::Runner, over the same
// weights) is tested against.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "microllm/nn/layers.h"

namespace microllm::nn {

struct TransformerConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 256;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  RopeParams rope;
  bool tie_word_embeddings = true;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // The block, as its family describes it (models/ reads it from config.json); training's modules and the
  // inference runner both build from these fields, so a family that only combines them needs no code of its own.
  NormPlacement norm_placement = NormPlacement::pre;
  bool attention_bias = false;  // biases on q, k and v (Qwen2)
  bool qk_norm = false;         // RMSNorm over each head of q and k before the rotary embedding (Qwen3)
  MlpActivation mlp_activation = MlpActivation::silu;
  // Sliding-window attention (Mistral, Qwen2's use_sliding_window): a query sees its sliding_window latest keys,
  // itself included, in the layers marked in sliding_layers (empty: every layer); 0: no window.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  // The sliding layers' own rotary embedding where it differs from `rope` (Gemma 3's rope_local_base_freq).
  std::optional<RopeParams> sliding_rope;
  // Gemma: attention scores scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2 (0: head_dim's).
  double query_pre_attn_scalar = 0;
  // Gemma: the embeddings multiplied by this (sqrt(hidden_size)), rounded to the compute dtype as transformers
  // rounds it; the tied head reads the table unscaled.
  double embedding_scale = 1;
  // Logits squashed to cap * tanh(logits / cap) (Gemma's final_logit_softcapping); 0: none.
  double final_logit_softcap = 0;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  // The longest context the model runs: max_position_embeddings, or with longrope or dynamic scaling their
  // original_max_position_embeddings (where transformers starts to turn every position, cached ones included,
  // another way: RopeScaling::long_factors, RopeScalingType::dynamic).
  int64_t context_limit() const;
  // Layer `layer`'s window (0: full attention).
  int64_t window_of(int64_t layer) const;
  // Layer `layer`'s attention: its window, its rotary embedding and its score scale (with the rotary scaling's
  // attention factor, squared: transformers scales q and k by it).
  AttentionConfig attention(int64_t layer = 0) const;
  // embedding_scale rounded to `dtype`, as the forward multiplies by it.
  double embedding_scale_in(DType dtype) const;
  // The number of weights a TransformerLM of this config holds (tied embeddings counted once).
  int64_t num_parameters() const;
  // Throws ValueError naming the field when the numbers cannot make a model.
  void validate() const;
  // Presets for training from scratch: "tiny" (~1M parameters with a byte vocabulary), "model-s"
  // (~15M), "model-m" (~50M). vocab_size is the tokenizer's.
  static TransformerConfig preset(const std::string& name, int64_t vocab_size);
};

class TransformerLM : public Module {
 public:
  // random_init false leaves the weights unwritten for a checkpoint to fill (models/loader.h).
  TransformerLM(const TransformerConfig& config, uint64_t seed, bool random_init = true);
  const TransformerConfig& config() const { return config_; }

  // ids [B, T] (i32/i64) -> logits [B, T, vocab] in the compute dtype: causal attention over the T tokens.
  Variable forward(const Tensor& ids, const ForwardContext& ctx) const;
  // Mean next-token cross-entropy of forward(ids) against targets [B, T] (-100 ignored).
  Variable loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx) const;
  // For inference: each layer's q/k/v and gate/up weights moved into one buffer each (nn::FusedProjections; names
  // and values unchanged), so that the runner multiplies each group as one weight without a copy. Call after
  // loading and after to(dtype)/to(device), which undo it.
  void fuse_projections();

  // The modules, for the inference runner.
  const Embedding& embed_tokens() const { return *embed_tokens_; }
  const std::vector<DecoderLayer*>& layers() const { return layers_; }
  const RMSNorm& norm() const { return *norm_; }
  const Linear* lm_head() const { return lm_head_; }  // null when tied to embed_tokens

 private:
  TransformerConfig config_;
  Embedding* embed_tokens_;
  std::vector<DecoderLayer*> layers_;
  RMSNorm* norm_;
  Linear* lm_head_ = nullptr;
};

// The attention weights of `layers` for ids [B, T] (one no-grad forward): each [B, Hq, T, T] f32, the softmax of
// the scaled causal scores, as transformers returns them with output_attentions=True and eager attention. The
// forward's own results are unchanged: its fused attention runs as always (nn/taps.h).
std::vector<Tensor> attention_weights(const TransformerLM& model, const Tensor& ids, const std::vector<int>& layers,
                                      const ForwardContext& ctx = {});

}  // namespace microllm::nn
