// A paged KV cache: every layer's keys and values live in a pool of fixed-size blocks, and each sequence owns a
// list of blocks (its row of a block table). Sequences of any length come and go without moving anyone's keys,
// and the memory a sequence holds is a multiple of the block size, not the model's window (vLLM's design).
//
// Token slot s of the pool is block s / block_size, row s % block_size. A forward with ForwardContext::paged
// writes each new token's k/v to its slot, then attends over its sequence's blocks:
//   decode        one token per sequence (B sequences, T = 1): ops::paged_attention reads the blocks through
//                 the block table on the device, so nothing about the step is a host-side kernel argument and
//                 the whole step can be replayed from a CUDA graph;
//   prefill chunk one sequence (B = 1), tokens [chunk_start, chunk_start + T): flash attention over the chunk,
//                 after gathering the sequence's earlier keys from its blocks when chunk_start > 0; or several
//                 whole prompts (chunk_start 0), one a row, right-padded to T with slots -1.
#pragma once

#include <vector>

#include "microllm/core/tensor.h"

namespace microllm::nn {

struct TransformerConfig;

class PagedKvCache {
 public:
  PagedKvCache(const TransformerConfig& config, int64_t num_blocks, int64_t block_size, DType dtype, Device device);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  // [num_blocks, block_size, Hkv, D]
  const Tensor& keys(int layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int layer) const { return values_.at(static_cast<size_t>(layer)); }
  size_t bytes() const;
  // The bytes one block holds over all layers (keys and values).
  static size_t block_bytes(const TransformerConfig& config, int64_t block_size, DType dtype);

 private:
  int64_t num_blocks_, block_size_;
  std::vector<Tensor> keys_, values_;
};

// What a forward over a paged cache needs besides the ids; every tensor is i32 on the model's device.
struct PagedBatch {
  PagedKvCache* cache = nullptr;
  Tensor slots;         // [B * T]: where each new token's k/v go; < 0 = a padding row, not written
  Tensor block_tables;  // [S, max_blocks]: each sequence's blocks in order
  // Decode (chunk_start < 0): one token per row of the batch.
  Tensor seq_ids;          // [B]: each row's row of block_tables
  Tensor query_positions;  // [B]: each row's position (it attends to keys 0..position); < 0 = padding
  int64_t max_context = 0;  // a bound on position + 1 over the rows (0: the block table's capacity)
  // Prefill chunk: the chunk's first position and its sequence's row of block_tables (B == 1), or 0 for a batch
  // of whole prompts (B >= 1, one a row).
  int64_t chunk_start = -1;
  int64_t chunk_row = 0;
};

}  // namespace microllm::nn
