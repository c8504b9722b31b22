// A decoder-only language model (Llama / Qwen2 / Qwen3 / Mistral family) and its KV cache.
#pragma once

#include <memory>
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
  bool attention_bias = false;
  bool qk_norm = false;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  // The number of weights a TransformerLM of this config holds (tied embeddings counted once).
  int64_t num_parameters() const;
  // Throws ValueError naming the field when the numbers cannot make a model.
  void validate() const;
  // Presets for training from scratch: "tiny" (~1M parameters with a byte vocabulary), "model-s"
  // (~15M), "model-m" (~50M). vocab_size is the tokenizer's.
  static TransformerConfig preset(const std::string& name, int64_t vocab_size);
};

// Keys and values of earlier tokens, preallocated: [layers] x [B, Hkv, max_tokens, D] each.
class KvCache {
 public:
  KvCache(const TransformerConfig& config, int64_t batch, int64_t max_tokens, DType dtype, Device device);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  // Writes k, v [B, T, Hkv, D] of `layer` at positions [length, length + T) and returns the cached
  // [B, Hkv, length + T, D] views. The length advances once every layer has appended (advance()).
  std::pair<Tensor, Tensor> append(int layer, const Tensor& k, const Tensor& v);
  void advance(int64_t tokens);
  void reset() { length_ = 0; }
  size_t bytes() const;

 private:
  std::vector<Tensor> keys_, values_;
  int64_t length_ = 0;
  int64_t capacity_;
};

class TransformerLM : public Module {
 public:
  // random_init false leaves the weights unwritten for a checkpoint to fill (models/loader.h).
  TransformerLM(const TransformerConfig& config, uint64_t seed, bool random_init = true);
  const TransformerConfig& config() const { return config_; }

  // ids [B, T] (i32/i64) -> logits [B, T, vocab] in the compute dtype.
  Variable forward(const Tensor& ids, const ForwardContext& ctx) const;
  // Inference: forward without the final norm and the head, for the k/v it leaves in ctx.cache or ctx.paged
  // (a prefill chunk whose logits nobody reads skips a pass over the vocabulary's weights).
  void fill_cache(const Tensor& ids, const ForwardContext& ctx) const;
  // Inference: each layer's q/k/v and gate/up projections computed as one GEMM each (nn::FusedProjections;
  // the weights move into shared buffers, names and values unchanged). Call after loading and after
  // to(dtype)/to(device), which undo it.
  void fuse_projections();
  // Mean next-token cross-entropy of forward(ids) against targets [B, T] (-100 ignored).
  Variable loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx) const;

 private:
  // The embedding and every layer: the residual stream as (delta, residual), each sum left to the next
  // RMSNorm kernel (residual undefined after layers that add it in their projections' epilogues:
  // DecoderLayer::forward_unsummed); fills in ctx.positions when unset.
  std::pair<Variable, Variable> run_layers(const Tensor& ids, ForwardContext& ctx) const;

  TransformerConfig config_;
  Embedding* embed_tokens_;
  std::vector<DecoderLayer*> layers_;
  RMSNorm* norm_;
  Linear* lm_head_ = nullptr;  // null when tied to embed_tokens
};

}  // namespace microllm::nn
