// The keys and values of earlier tokens, as the inference runner (generate/runner.h) attends through them: one
// interface, two stores.
//   ContiguousKvCache  [layers] x [B, Hkv, capacity, D]: sequences that advance together (generate(),
//                      generate_batch() with left padding and its mask, bench --path plain).
//   PagedKvCache       a pool of fixed-size blocks per layer, each sequence owning a list of blocks (its row of a
//                      block table): sequences of any length come and go without moving anyone's keys (vLLM's
//                      design; the serving engine). Token slot s is block s / block_size, row s % block_size. A
//                      forward attends through one of its batches:
//     PagedDecode      one token per sequence (B rows, T = 1): rotary, cache write and attention in one op that
//                      reads the block tables on the device, so nothing about the step is a host-side kernel
//                      argument and the whole step replays from a CUDA graph; the o projection fused into it where
//                      its kernel can (ops::paged_decode_attention_projected);
//     PagedPrefill     a chunk [start, start + T) of one sequence's prompt (B = 1): flash attention over the chunk
//                      and, past the prompt's start, the sequence's earlier keys gathered from its blocks; or whole
//                      prompts (start 0), one a row, right-padded to T with slots -1 (not written; causal attention
//                      keeps the padding out of the rows before it).
// A forward of the runner calls attend_projected() once per layer, in order, then finish_forward().
#pragma once

#include <cstdint>
#include <vector>

#include "microllm/core/tensor.h"
#include "microllm/ops/linear_weight.h"
#include "microllm/ops/rope.h"

namespace microllm::nn {
struct TransformerConfig;
}

namespace microllm::generate {

// What a layer's attention takes from the config besides q, k and v: its sliding window (0: every earlier key) and
// its score scale (Gemma's query_pre_attn_scalar, yarn's attention factor; nn::TransformerConfig::attention).
struct LayerAttention {
  int64_t window = 0;
  double scale = 0;
};
std::vector<LayerAttention> layer_attention(const nn::TransformerConfig& config);  // one a layer

class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  // q [B, T, Hq, D], k and v [B, T, Hkv, D] of `layer`, before the rotary embedding: k and v stored, each query
  // attending (causally) to its sequence's keys. Returns [B, T, Hq * D] in q's dtype.
  virtual Tensor attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope) = 0;
  // out [B, T, hidden] = addend + attend() @ o^T (addend undefined: none), rounded once, with q and k first
  // normalized by qk_norm where it is defined (qk_rms_norm). The default is that composition; the paged decode step
  // folds the norm into its attention kernel's loads and the projection into its end.
  virtual Tensor attend_projected(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                  const QkNormParams& qk_norm, const LinearWeight& o, const Tensor& addend);
  // After the forward's last layer, for the `tokens` tokens of each row it stored.
  virtual void finish_forward(int64_t tokens) { (void)tokens; }
};

class ContiguousKvCache : public AttentionCache {
 public:
  ContiguousKvCache(const nn::TransformerConfig& config, int64_t batch, int64_t capacity, DType dtype, Device device);
  int64_t length() const { return length_; }  // tokens cached per row
  int64_t capacity() const { return capacity_; }
  void reset() { length_ = 0; }
  size_t bytes() const;
  // The next forward's rotary positions [B, T] (i32/i64); undefined: length, length + 1, ... for every row.
  void set_positions(Tensor positions) { positions_ = std::move(positions); }
  // u8 [B, 1, 1, capacity]: key j of row b may be attended to when nonzero (left padding of generate_batch, whose
  // padding keys are masked); undefined: every key.
  void set_key_mask(Tensor mask) { key_mask_ = std::move(mask); }

  Tensor attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope) override;
  void finish_forward(int64_t tokens) override;

 private:
  std::vector<Tensor> keys_, values_;
  std::vector<LayerAttention> layers_;
  int64_t length_ = 0, capacity_;
  Tensor positions_, key_mask_;
};

class PagedKvCache {
 public:
  PagedKvCache(const nn::TransformerConfig& config, int64_t num_blocks, int64_t block_size, DType dtype, Device device);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  // [num_blocks, block_size, Hkv, D]
  const Tensor& keys(int layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int layer) const { return values_.at(static_cast<size_t>(layer)); }
  // The layer's window and score scale, the config's.
  const LayerAttention& attention(int layer) const { return layers_.at(static_cast<size_t>(layer)); }
  size_t bytes() const;
  // The bytes one block holds over all layers (keys and values).
  static size_t block_bytes(const nn::TransformerConfig& config, int64_t block_size, DType dtype);

 private:
  int64_t num_blocks_, block_size_;
  std::vector<Tensor> keys_, values_;
  std::vector<LayerAttention> layers_;
};

// One decode step over a paged cache. Every tensor is i32 on the cache's device, read there (a CUDA graph replays
// the step with new values).
class PagedDecode : public AttentionCache {
 public:
  struct Inputs {
    Tensor slots;             // [B]: where each row's new k/v go; < 0: a padding row, not written
    Tensor block_tables;      // [S, max_blocks]: each sequence's blocks in order
    Tensor seq_ids;           // [B]: each row's row of block_tables
    Tensor positions;         // [B]: each row's position (rotary, and it attends to keys 0..position); < 0: padding
    int64_t max_context = 0;  // a bound on position + 1 over the rows
  };
  PagedDecode(const PagedKvCache& cache, Inputs inputs) : cache_(cache), in_(std::move(inputs)) {}
  Tensor attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope) override;
  Tensor attend_projected(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                          const QkNormParams& qk_norm, const LinearWeight& o, const Tensor& addend) override;

 private:
  const PagedKvCache& cache_;
  Inputs in_;
};

// One prefill forward over a paged cache (i32 tensors on the cache's device).
class PagedPrefill : public AttentionCache {
 public:
  struct Inputs {
    Tensor slots;             // [B * T]: where each token's k/v go; < 0: padding, not written
    Tensor positions;         // [B, T]: rotary positions
    Tensor block_tables;      // [S, max_blocks]
    int64_t chunk_start = 0;  // the chunk's first position (B == 1), or 0 for whole prompts (B >= 1)
    int64_t chunk_row = 0;    // the chunk's sequence's row of block_tables (read when chunk_start > 0)
  };
  PagedPrefill(const PagedKvCache& cache, Inputs inputs) : cache_(cache), in_(std::move(inputs)) {}
  Tensor attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope) override;

 private:
  const PagedKvCache& cache_;
  Inputs in_;
};

}  // namespace microllm::generate
