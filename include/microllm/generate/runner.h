// The inference runner: a TransformerLM's weights run for generation. The model (nn/transformer.h) stays the plain
// graph that training differentiates; the runner holds the same weights as inference multiplies them (each
// layer's q/k/v and gate/up as one LinearWeight, norms and projections folded into one op where a backend can,
// residual adds in the epilogues) and attends through a KV cache (generate/kv_cache.h: contiguous or paged). It
// builds each block from the family's description in the config (norm placement, QK-norm, biases, the MLP's
// activation), so a family that combines those needs no runner code. Its logits equal the model's forward up to
// the summation order of the fused kernels (tests/generate/runner_test.cpp).
//
//   generate::Runner runner(model, DType::bf16);
//   generate::ContiguousKvCache cache(model.config(), 1, 256, DType::bf16, device);
//   Tensor logits = runner.forward(prompt_ids, cache, generate::LogitRows::last());   // [1, 1, vocab]
#pragma once

#include <cstdint>
#include <vector>

#include "microllm/generate/kv_cache.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/linear_weight.h"

namespace microllm::generate {

// Which rows of a forward reach the head: every token's, each sequence's last, or one row per sequence chosen on
// the device (i32 [B] flat indices b * T + t into the B * T rows: padded prompts batched in a CUDA graph).
struct LogitRows {
  enum class Kind : uint8_t { all, last, chosen } kind = Kind::all;
  Tensor rows;
  static LogitRows all() { return {}; }
  static LogitRows last() { return {Kind::last, Tensor()}; }
  static LogitRows chosen(Tensor rows) { return {Kind::chosen, std::move(rows)}; }
};

class Runner {
 public:
  // The model's weights in `dtype` (the compute dtype): the ones already in that dtype are shared, joined
  // projections (TransformerLM::fuse_projections) without a copy; others are converted once, here. The model
  // must outlive the runner and keep its weights where they are.
  Runner(const nn::TransformerLM& model, DType dtype);

  // ids [B, T] (i32/i64) on the model's device through every layer, attending through `cache`: logits [B, T, V]
  // (LogitRows::all), [B, 1, V] (last, chosen), in the compute dtype.
  Tensor forward(const Tensor& ids, AttentionCache& cache, const LogitRows& rows = LogitRows::all()) const;
  // The layers only, for the keys and values they leave in `cache` (a prompt's chunk whose logits nobody reads).
  void fill(const Tensor& ids, AttentionCache& cache) const;

  const nn::TransformerConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

 private:
  struct Block {
    nn::NormPlacement placement;
    // Weights in dtype; pre_feedforward_norm and post_feedforward_norm in sandwich blocks only.
    Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    double eps;
    LinearWeight qkv, o, gate_up, down;
    QkNormParams qk_norm;  // undefined weights: none
    GatedActivation gate;  // the MLP's activation
    RopeParams rope;       // the layer's rotary embedding
  };
  // The embedding and every block: the residual stream as (delta, residual), each sum left to the next norm.
  std::pair<Tensor, Tensor> layers(const Tensor& ids, AttentionCache& cache) const;
  std::pair<Tensor, Tensor> block(int index, const Tensor& x, const Tensor& x_norm, const Tensor& residual,
                                  AttentionCache& cache) const;
  Tensor attention(int index, const Tensor& qkv, const Tensor& addend, AttentionCache& cache) const;

  nn::TransformerConfig config_;
  DType dtype_;
  int trace_device_ = -1;  // the CUDA device its GPU trace spans are on; -1: the CPU
  Tensor embedding_, final_norm_;
  double embedding_scale_ = 1;  // the config's, rounded to the compute dtype
  LinearWeight head_;
  std::vector<Block> blocks_;
};

}  // namespace microllm::generate
