// The engine's scheduler: which requests hold a batch row and KV blocks, which prompt prefills next and in what
// shape, which sequences a decode step feeds, and when a sequence ends. Host bookkeeping only: no model, no
// device, so its rules are tested by themselves (tests/generate/scheduler_test.cpp runs thousands of random
// arrival / finish / cancel sequences). The engine (engine.cpp) executes its plans on the device and reports
// back what they produced. Internal header of the generate layer.
//
// The rules:
//   admission   waiting requests in arrival order get a free row and the blocks for prompt + max_new_tokens
//               (capped to the window); the first that does not fit stops the ones behind it (no request is
//               passed by a later one, so a large request is never starved by small ones), and nothing runs out
//               of blocks half-way (no preemption needed);
//   prefill     one forward per step: the whole prompts of the oldest sequence still prefilling and of later
//               unstarted ones that fit one chunk with it (rows and length padded to powers of two), or one
//               chunk of the oldest's longer prompt;
//   decode      one step feeds every decoding sequence that the steps already enqueued leave short of its token
//               budget and of the window; rows and the attention's context bound are padded to the graph buckets;
//   stopping    a sequence ends at a stop id, at max_new_tokens, at the window, or when cancelled.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "microllm/generate/generate.h"

namespace microllm::generate {

struct SchedulerLimits {
  int64_t max_batch = 1;      // batch rows
  int64_t block_size = 16;    // tokens per KV block
  int64_t num_blocks = 1;     // blocks in the pool
  int64_t window = 1;         // the model's max_position_embeddings
  int64_t prefill_chunk = 1;  // prompt tokens per prefill forward at most
};

// One request as the scheduler tracks it. The engine's sequences derive from it (adding the request's ids,
// sampling and callbacks).
struct SequenceState {
  virtual ~SequenceState() = default;

  // Set before submit.
  int64_t prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  bool greedy = false;             // temperature 0: decode steps of greedy rows only sample without a sort
  std::vector<int64_t> stop_ids;   // a generated id among them ends the sequence

  // Kept by the scheduler.
  uint64_t id = 0;
  int64_t row = -1;             // batch row while admitted: block table row, sampler row, decode row
  std::vector<int32_t> blocks;  // reserved at admission for prompt + max_new_tokens
  int64_t cached = 0;           // tokens whose k/v are in the cache, or will be once the steps enqueued run
  bool decoding = false;        // its prompt is prefilled (or is one token): decode steps feed it
  int64_t generated = 0;        // tokens accepted
  int64_t steps_in_flight = 0;  // steps enqueued that sample for it and were not read yet
};

// The next prefill forward.
struct PrefillPlan {
  std::vector<SequenceState*> sequences;  // whole prompts, a row each; or the one sequence whose chunk runs
  bool whole_prompts = false;
  int64_t rows = 1, length = 0;  // whole prompts: the padded shape (powers of two; length within the chunk)
  int64_t start = 0, count = 0;  // a chunk: tokens [start, start + count) of the prompt; whole prompts: count is
                                 // the longest prompt (the unpadded width)
  bool last = true;              // it ends each prompt it holds: it samples their first tokens
};

// The next decode step.
struct DecodePlan {
  std::vector<SequenceState*> fed;  // one token each, row order of no importance
  int64_t rows = 0;                 // rows [0, rows) run (a power of two covering the highest fed row, <= max_batch)
  int64_t context = 0;              // the attention's key bound (a power of two >= 256, <= the window in blocks)
  bool greedy_only = false;         // every decoding sequence in rows [0, rows) is greedy
};

// What the scheduler counts for stats.
struct SchedulerCounts {
  int64_t waiting = 0, prefilling = 0, decoding = 0;
  int64_t blocks_used = 0;  // the pool's blocks not free (those the running sequences hold, unless one leaked)
  int64_t blocks_total = 0;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerLimits limits);

  // ---- any thread ----
  // Queues a sequence (prompt_tokens >= 1, max_new_tokens >= 1) and returns its id. ValueError when it could
  // never run: its prompt fills the window, or it needs more blocks than the pool has.
  uint64_t submit(std::unique_ptr<SequenceState> sequence);
  // Marks a sequence to end at the next take_cancelled(); unknown or ended ids are ignored.
  void cancel(uint64_t id);
  SchedulerCounts counts() const;
  bool idle() const;  // nothing waiting or running

  // ---- the engine's thread ----
  // The cancelled sequences: those never admitted (removed, returned for their callbacks) and those running
  // (still running: the caller ends them with finish()).
  struct Cancelled {
    std::vector<std::unique_ptr<SequenceState>> never_started;
    std::vector<SequenceState*> running;
  };
  Cancelled take_cancelled();
  // Admits waiting sequences (the rule above); returns them in admission order. A one-token prompt is decoding
  // at once (it has nothing to prefill).
  std::vector<SequenceState*> admit();
  std::optional<PrefillPlan> next_prefill() const;
  // The plan ran: its tokens are cached; the sequences it ended start decoding with one sample in flight.
  void prefilled(const PrefillPlan& plan);
  std::optional<DecodePlan> next_decode() const;
  void decoded(const DecodePlan& plan);  // enqueued: each fed sequence has one more token cached and in flight
  // `token` was sampled for `sequence` by a step now read: nullopt while it goes on, else why it ends (a stop
  // id, max_new_tokens, the window). The caller then calls finish().
  std::optional<FinishReason> accept(SequenceState& sequence, int32_t token);
  // Ends a running sequence: its row and blocks go back; returns it.
  std::unique_ptr<SequenceState> finish(SequenceState* sequence);

  // The sequence in `row` (null when free), the running ones in admission order.
  SequenceState* in_row(int64_t row) const { return rows_[static_cast<size_t>(row)]; }
  const std::deque<std::unique_ptr<SequenceState>>& running() const { return running_; }
  // The KV slot of the token at `position` of a sequence.
  int32_t slot_of(const SequenceState& sequence, int64_t position) const;
  const SchedulerLimits& limits() const { return limits_; }

  // The padded shapes the engine captures graphs for.
  static constexpr int64_t kMinContextBucket = 256;
  static constexpr int64_t kMinPromptBucket = 16;
  int64_t prompt_bucket(int64_t length) const;

 private:
  int64_t blocks_for(const SequenceState& sequence) const;
  std::vector<SequenceState*> whole_prompts(SequenceState& front) const;
  void publish();  // the counts other threads read

  SchedulerLimits limits_;
  int64_t max_blocks_per_sequence_;
  // Shared with other threads under mutex_: waiting_, cancelled_, next_id_, counts_.
  mutable std::mutex mutex_;
  std::deque<std::unique_ptr<SequenceState>> waiting_;
  std::set<uint64_t> cancelled_;
  uint64_t next_id_ = 1;
  SchedulerCounts counts_;
  // The engine's thread only (running_ is also sized under the lock, for idle()).
  std::deque<std::unique_ptr<SequenceState>> running_;  // admission order; the front prefills first
  std::vector<SequenceState*> rows_;
  std::vector<int32_t> free_blocks_;
};

}  // namespace microllm::generate
