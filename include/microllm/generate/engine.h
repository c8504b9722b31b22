// The serving engine: continuous batching over a paged KV cache.
//
// Requests arrive (submit, from any thread) and leave (finish or cancel) at any time, each with its own
// sampling parameters, token budget and stop ids. Every step() does, on the engine's thread:
//   1. admission: waiting requests get a batch row and the KV blocks for prompt + max_new_tokens, in arrival
//      order, while rows and blocks are free (a request that could never fit is refused by submit);
//   2. one prefill forward: the whole prompts of the oldest request still prefilling and of the later ones
//      that fit one chunk (prefill_chunk tokens) with it, a row each, padded; or one chunk of the oldest's
//      longer prompt, so a long prompt never stalls the sequences already decoding for more than one chunk.
//      A prompt's last forward samples the request's first token from the prompt's last logits, on the device
//      (a one-token prompt has no prefill: its first decode step feeds it). On CUDA a forward's ~300 kernels
//      are replayed from a CUDA graph (one launch for the host, not ~300) when it is a full chunk before a
//      prompt's last (a graph per chunk start) or whole prompts (rows and lengths padded to powers of two, a
//      graph per padded shape); only the last chunk of a longer prompt runs eagerly;
//   3. one decode step for every decoding sequence: one forward over [rows, 1] through the paged cache with
//      the tokens sampled on the device; on CUDA it is replayed from a CUDA graph captured per (batch bucket,
//      context bucket). The step's last kernel moves its positions and slots on by one token on the device
//      and writes the chosen ids to pinned host memory, so while the batch stays the same a step costs one
//      graph launch and no copy (the host uploads the inputs only when they change). Each step feeds the ids
//      the step before sampled where they are, on the device, so step t + 1 is enqueued before step t's ids
//      are read: the GPU runs it while the host hands step t's tokens to their requests. A stop id or a
//      cancellation therefore shows one step late: the sequence was fed once more, and that token is
//      discarded (EngineStats::discarded_rows).
// Batching changes no result: each sequence attends only to its own blocks, and with greedy sampling a
// request gets the tokens it gets alone.
//
//   Engine engine(model, {.max_batch = 8, .dtype = DType::bf16});
//   engine.submit({.prompt = ids, .max_new_tokens = 64, .on_token = [](int32_t t) { ...; return true; }});
//   engine.run_until_idle();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "microllm/generate/generate.h"
#include "microllm/nn/transformer.h"

namespace microllm::generate {

struct EngineOptions {
  int64_t max_batch = 32;      // sequences in the decode batch at once (rows)
  int64_t block_size = 16;     // tokens per KV block
  int64_t kv_blocks = 0;       // blocks in the pool; 0: kv_memory_fraction of the free device memory (CUDA) or
                               // 1 GiB (CPU), at most max_batch full windows
  double kv_memory_fraction = 0.5;
  int64_t prefill_chunk = 512;  // prompt tokens per prefill forward (several whole prompts, padded, or one chunk)
  bool cuda_graphs = true;      // replay decode steps and prefill chunks from CUDA graphs (CUDA only)
  DType dtype = DType::f32;     // compute and KV cache dtype
};

struct EngineRequest {
  std::vector<int32_t> prompt;  // not empty, shorter than the model's window
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int64_t> stop_ids;
  // Called on the engine's thread with each new token (a stop id that ends it included); false cancels.
  std::function<bool(int32_t token)> on_token;
  // Called once on the engine's thread when the request ends, with all its tokens.
  std::function<void(const Generation& result)> on_finish;
};

struct EngineStats {
  int64_t waiting = 0, prefilling = 0, decoding = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, block_size = 0;
  uint64_t steps = 0, decode_steps = 0, graph_replays = 0, graphs_captured = 0;  // graphs: decode and prefill
  uint64_t prefill_forwards = 0;       // prefill forwards run: chunks of a long prompt, batches of whole prompts
  uint64_t prefill_graph_replays = 0;  // prefill forwards replayed from a graph (graph_replays counts decode steps)
  uint64_t greedy_decode_steps = 0;  // decode steps whose every row was greedy (SamplerRows::greedy_only)
  uint64_t decoded_sequences = 0;  // tokens decode steps gave their sequences: / decode_steps is the mean batch
  uint64_t input_uploads = 0;      // decode steps that uploaded their positions and slots: the others found
                                   // them moved on by the step before, on the device (the batch was the same)
  uint64_t prefill_samples = 0;    // first tokens sampled by a prompt's last prefill forward (every prompt of 2+
                                   // tokens): / prefill_forwards > 1 when whole prompts were batched
  uint64_t discarded_rows = 0;     // rows fed for a sequence that had ended by the time their step was read
  uint64_t prompt_tokens = 0, generated_tokens = 0;
};

class Engine {
 public:
  Engine(const nn::TransformerLM& model, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id. Thread-safe. ValueError when it can never run: an empty prompt,
  // an id outside the vocabulary, a prompt that fills the window, or more KV blocks than the pool has.
  uint64_t submit(EngineRequest request);
  // Ends a request at its next step (finish reason callback). Thread-safe; unknown or finished ids are ignored.
  void cancel(uint64_t id);
  // One scheduling step (see above). Returns false when there was nothing to do.
  bool step();
  void run_until_idle();
  bool idle() const;

  EngineStats stats() const;
  const EngineOptions& options() const;
  // The longest prompt + max_new_tokens one request can reserve.
  int64_t max_request_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace microllm::generate
