#include "generate/scheduler.h"

#include <algorithm>
#include <bit>

#include "microllm/core/error.h"

namespace microllm::generate {

namespace {

// Decode steps run for these row counts (the smallest that covers the highest busy row): each is a CUDA graph.
constexpr int64_t kBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The smallest power of two >= max(n, least).
int64_t pow2_bucket(int64_t n, int64_t least = 1) {
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max(n, least))));
}

}  // namespace

Scheduler::Scheduler(SchedulerLimits limits) : limits_(limits) {
  MICROLLM_CHECK(limits.max_batch >= 1, ValueError, "engine", "max_batch must be >= 1, got ", limits.max_batch);
  MICROLLM_CHECK(limits.block_size >= 1, ValueError, "engine", "block_size must be >= 1, got ", limits.block_size);
  MICROLLM_CHECK(limits.prefill_chunk >= 1, ValueError, "engine", "prefill_chunk must be >= 1, got ",
                 limits.prefill_chunk);
  MICROLLM_CHECK(limits.num_blocks >= 1 && limits.window >= 2, ValueError, "engine", "a pool of ", limits.num_blocks,
                 " blocks and a window of ", limits.window, " tokens cannot hold a sequence");
  max_blocks_per_sequence_ = ceil_div(limits.window, limits.block_size);
  rows_.assign(static_cast<size_t>(limits.max_batch), nullptr);
  free_blocks_.resize(static_cast<size_t>(limits.num_blocks));
  for (int64_t i = 0; i < limits.num_blocks; ++i) {
    free_blocks_[static_cast<size_t>(i)] = static_cast<int32_t>(limits.num_blocks - 1 - i);
  }
  counts_.blocks_total = limits.num_blocks;
}

// Prompt + max_new_tokens, capped to the window, in blocks.
int64_t Scheduler::blocks_for(const SequenceState& s) const {
  return ceil_div(std::min(s.prompt_tokens + s.max_new_tokens, limits_.window), limits_.block_size);
}

uint64_t Scheduler::submit(std::unique_ptr<SequenceState> s) {
  MICROLLM_CHECK(s->prompt_tokens >= 1, ValueError, "engine", "the prompt is empty");
  MICROLLM_CHECK(s->max_new_tokens >= 1, ValueError, "engine", "max_new_tokens must be >= 1, got ", s->max_new_tokens);
  MICROLLM_CHECK(s->prompt_tokens < limits_.window, ValueError, "engine", "the prompt has ", s->prompt_tokens,
                 " tokens; the model's window is ", limits_.window);
  const int64_t blocks = blocks_for(*s);
  MICROLLM_CHECK(blocks <= limits_.num_blocks, ValueError, "engine", "the prompt (", s->prompt_tokens, " tokens) and ",
                 s->max_new_tokens, " new tokens need ", blocks, " KV blocks of ", limits_.block_size,
                 " tokens; the cache has ", limits_.num_blocks, " in all");
  std::lock_guard lock(mutex_);
  s->id = next_id_++;
  const uint64_t id = s->id;
  waiting_.push_back(std::move(s));
  counts_.waiting = static_cast<int64_t>(waiting_.size());
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard lock(mutex_);
  cancelled_.insert(id);
}

SchedulerCounts Scheduler::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

bool Scheduler::idle() const {
  std::lock_guard lock(mutex_);
  return waiting_.empty() && running_.empty();
}

void Scheduler::publish() {
  int64_t prefilling = 0, decoding = 0;
  for (const auto& s : running_) (s->decoding ? decoding : prefilling) += 1;
  std::lock_guard lock(mutex_);
  counts_.waiting = static_cast<int64_t>(waiting_.size());
  counts_.prefilling = prefilling;
  counts_.decoding = decoding;
  counts_.blocks_used = limits_.num_blocks - static_cast<int64_t>(free_blocks_.size());  // a leak shows here
}

Scheduler::Cancelled Scheduler::take_cancelled() {
  Cancelled out;
  {
    std::lock_guard lock(mutex_);
    if (cancelled_.empty()) return out;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancelled_.erase((*it)->id)) {
        out.never_started.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    std::set<uint64_t> still;  // the running ones stay marked until finish(); other ids ended already
    for (const auto& s : running_) {
      if (cancelled_.count(s->id)) {
        out.running.push_back(s.get());
        still.insert(s->id);
      }
    }
    cancelled_ = std::move(still);
  }
  publish();
  return out;
}

std::vector<SequenceState*> Scheduler::admit() {
  std::vector<SequenceState*> admitted;
  for (;;) {
    std::unique_ptr<SequenceState> s;
    {
      std::lock_guard lock(mutex_);
      if (waiting_.empty()) break;
      const auto free_row = std::find(rows_.begin(), rows_.end(), nullptr);
      const int64_t need = blocks_for(*waiting_.front());
      if (free_row == rows_.end() || need > static_cast<int64_t>(free_blocks_.size())) break;
      s = std::move(waiting_.front());
      waiting_.pop_front();
      s->row = free_row - rows_.begin();
      for (int64_t i = 0; i < need; ++i) {
        s->blocks.push_back(free_blocks_.back());
        free_blocks_.pop_back();
      }
      rows_[static_cast<size_t>(s->row)] = s.get();
      s->decoding = s->prompt_tokens == 1;  // nothing to prefill: its first decode step feeds the prompt
      admitted.push_back(s.get());
      running_.push_back(std::move(s));
    }
  }
  if (!admitted.empty()) publish();
  return admitted;
}

int64_t Scheduler::prompt_bucket(int64_t length) const {
  return std::min(pow2_bucket(length, kMinPromptBucket), limits_.prefill_chunk);
}

// `front` and the sequences after it not yet started whose whole prompts fit one forward with it: the rows
// (padded to a power of two) times the longest prompt's bucket within prefill_chunk. A prompt longer than a chunk
// never joins (its bucket is the whole chunk); it is chunked alone when it reaches the front.
std::vector<SequenceState*> Scheduler::whole_prompts(SequenceState& front) const {
  std::vector<SequenceState*> group{&front};
  int64_t longest = front.prompt_tokens;
  bool after_front = false;
  for (const auto& s : running_) {
    if (!after_front) {
      after_front = s.get() == &front;
      continue;
    }
    if (s->decoding || s->cached > 0) continue;  // decoding, or the front's chunks (only it has any)
    const int64_t length = std::max(longest, s->prompt_tokens);
    const int64_t prompt_rows = pow2_bucket(static_cast<int64_t>(group.size()) + 1);
    if (prompt_rows * prompt_bucket(length) > limits_.prefill_chunk) continue;
    group.push_back(s.get());
    longest = length;
  }
  return group;
}

std::optional<PrefillPlan> Scheduler::next_prefill() const {
  SequenceState* front = nullptr;
  for (const auto& s : running_) {
    if (!s->decoding) {
      front = s.get();
      break;
    }
  }
  if (!front) return std::nullopt;
  PrefillPlan plan;
  if (front->cached == 0 && front->prompt_tokens <= limits_.prefill_chunk) {
    plan.sequences = whole_prompts(*front);
    plan.whole_prompts = true;
    int64_t longest = 0;
    for (const SequenceState* s : plan.sequences) longest = std::max(longest, s->prompt_tokens);
    plan.rows = pow2_bucket(static_cast<int64_t>(plan.sequences.size()));
    plan.length = prompt_bucket(longest);
    plan.count = longest;
    return plan;
  }
  plan.sequences = {front};
  plan.start = front->cached;
  plan.count = std::min(limits_.prefill_chunk, front->prompt_tokens - plan.start);
  plan.last = plan.start + plan.count == front->prompt_tokens;
  return plan;
}

void Scheduler::prefilled(const PrefillPlan& plan) {
  for (SequenceState* s : plan.sequences) {
    s->cached = plan.whole_prompts ? s->prompt_tokens : s->cached + plan.count;
    if (!plan.last) continue;
    s->decoding = true;
    ++s->steps_in_flight;  // its first token, sampled from the prompt's last logits
  }
  publish();
}

std::optional<DecodePlan> Scheduler::next_decode() const {
  DecodePlan plan;
  int64_t highest_row = -1, longest = 0;
  for (const auto& s : running_) {
    // Fed when the steps already enqueued leave it short of its budget and of the window (one of them that
    // ends it by length is never followed by another).
    if (!s->decoding || s->generated + s->steps_in_flight >= s->max_new_tokens || s->cached >= limits_.window) continue;
    plan.fed.push_back(s.get());
    highest_row = std::max(highest_row, s->row);
    longest = std::max(longest, s->cached + 1);
  }
  if (plan.fed.empty()) return std::nullopt;
  plan.rows = limits_.max_batch;
  for (int64_t b : kBatchBuckets) {
    if (b > highest_row) {
      plan.rows = std::min(b, limits_.max_batch);
      break;
    }
  }
  // Rows without a decoding sequence sample greedily (the engine keeps greedy params there); those with one
  // decide, fed or not (a sequence not fed ends when an earlier step is read: its params stay).
  plan.greedy_only = true;
  for (const auto& s : running_) {
    if (s->decoding && s->row < plan.rows) plan.greedy_only = plan.greedy_only && s->greedy;
  }
  plan.context = std::min(pow2_bucket(longest, kMinContextBucket), max_blocks_per_sequence_ * limits_.block_size);
  return plan;
}

void Scheduler::decoded(const DecodePlan& plan) {
  for (SequenceState* s : plan.fed) {
    ++s->cached;  // the fed token's k/v are written by the step
    ++s->steps_in_flight;
  }
}

std::optional<FinishReason> Scheduler::accept(SequenceState& s, int32_t token) {
  --s.steps_in_flight;
  ++s.generated;
  if (std::find(s.stop_ids.begin(), s.stop_ids.end(), int64_t{token}) != s.stop_ids.end()) return FinishReason::eos;
  if (s.generated >= s.max_new_tokens) return FinishReason::length;
  if (s.prompt_tokens + s.generated > limits_.window) return FinishReason::context;  // no position left to feed it at
  return std::nullopt;
}

std::unique_ptr<SequenceState> Scheduler::finish(SequenceState* s) {
  rows_[static_cast<size_t>(s->row)] = nullptr;
  std::unique_ptr<SequenceState> owned;
  {
    std::lock_guard lock(mutex_);
    const auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
    MICROLLM_CHECK(it != running_.end(), ValueError, "engine", "sequence ", s->id, " is not running");
    owned = std::move(*it);
    running_.erase(it);
    free_blocks_.insert(free_blocks_.end(), owned->blocks.rbegin(), owned->blocks.rend());
    cancelled_.erase(owned->id);
  }
  publish();
  return owned;
}

int32_t Scheduler::slot_of(const SequenceState& s, int64_t position) const {
  const auto block = static_cast<size_t>(position / limits_.block_size);
  return static_cast<int32_t>(s.blocks[block] * limits_.block_size + position % limits_.block_size);
}

}  // namespace microllm::generate
