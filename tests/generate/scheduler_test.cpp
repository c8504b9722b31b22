// The engine's scheduler alone (src/generate/scheduler.h), no model: thousands of random arrival / token /
// stop / cancel sequences against its rules. After every step: no KV block leaked or shared, no sequence past
// its reserved blocks, admission never over-commits rows or blocks and never lets a later request pass an
// earlier one, plans within their buckets; and every request ends exactly once (none starves).
#include "generate/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "microllm/core/random.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

constexpr int32_t kStop = 7;  // the stop id of every simulated request

std::unique_ptr<SequenceState> request(int64_t prompt, int64_t max_new, bool greedy = true) {
  auto s = std::make_unique<SequenceState>();
  s->prompt_tokens = prompt;
  s->max_new_tokens = max_new;
  s->greedy = greedy;
  s->stop_ids = {kStop};
  return s;
}

int64_t blocks_needed(const SchedulerLimits& l, int64_t prompt, int64_t max_new) {
  return (std::min(prompt + max_new, l.window) + l.block_size - 1) / l.block_size;
}

// An engine without a model: runs the scheduler's plans, reads each decode step one step late as the engine
// does, draws tokens (now and then the stop id), cancels at random; checks the invariants after every step.
class Simulation {
 public:
  Simulation(SchedulerLimits limits, uint64_t seed) : limits_(limits), scheduler_(limits), gen_(seed) {}

  void submit_random() {
    const int64_t prompt = 1 + static_cast<int64_t>(gen_.next_below(static_cast<uint64_t>(limits_.window)));
    const int64_t max_new = 1 + static_cast<int64_t>(gen_.next_below(static_cast<uint64_t>(2 * limits_.window)));
    const bool fits = prompt < limits_.window && blocks_needed(limits_, prompt, max_new) <= limits_.num_blocks;
    try {
      const uint64_t id = scheduler_.submit(request(prompt, max_new, gen_.next_below(2) == 0));
      EXPECT_TRUE(fits) << "accepted a request that can never run: prompt " << prompt << ", " << max_new << " new";
      live_.insert(id);
      submitted_.push_back(id);
    } catch (const ValueError&) {
      EXPECT_FALSE(fits) << "refused a request that fits: prompt " << prompt << ", " << max_new << " new";
    }
  }

  void cancel_random() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, static_cast<long>(gen_.next_below(live_.size())));
    scheduler_.cancel(*it);
  }

  // One engine step: cancellations, admission, a prefill, a decode step, reading what is due.
  void step() {
    Scheduler::Cancelled cancelled = scheduler_.take_cancelled();
    for (auto& s : cancelled.never_started) end(s->id);
    for (SequenceState* s : cancelled.running) end(scheduler_.finish(s)->id);
    const std::vector<SequenceState*> admitted = scheduler_.admit();
    for (SequenceState* s : admitted) {
      EXPECT_TRUE(std::find(admitted_.begin(), admitted_.end(), s->id) == admitted_.end());
      admitted_.push_back(s->id);
    }
    check_arrival_order();
    if (const std::optional<PrefillPlan> plan = scheduler_.next_prefill()) {
      check_prefill(*plan);
      if (plan->last) {
        InFlight step;
        for (SequenceState* s : plan->sequences) step.push_back({s->row, s->id});
        in_flight_.push_back(step);
      }
      scheduler_.prefilled(*plan);
    }
    bool decoded = false;
    if (const std::optional<DecodePlan> plan = scheduler_.next_decode()) {
      check_decode(*plan);
      InFlight step;
      for (SequenceState* s : plan->fed) step.push_back({s->row, s->id});
      scheduler_.decoded(*plan);
      in_flight_.push_back(step);
      decoded = true;
    }
    const size_t keep = decoded ? 1 : 0;
    while (in_flight_.size() > keep) read_oldest();
    if (scheduler_.running().empty()) {
      while (!in_flight_.empty()) read_oldest();
    }
    check_state();
  }

  bool idle() const { return scheduler_.idle() && in_flight_.empty(); }
  const std::set<uint64_t>& live() const { return live_; }
  size_t submitted() const { return submitted_.size(); }
  size_t ended() const { return ended_.size(); }

 private:
  using InFlight = std::vector<std::pair<int64_t, uint64_t>>;  // (row, id) fed by a step

  void read_oldest() {
    const InFlight step = in_flight_.front();
    in_flight_.pop_front();
    for (const auto& [row, id] : step) {
      SequenceState* s = scheduler_.in_row(row);
      if (!s || s->id != id) continue;  // ended since: its token is discarded
      const int32_t token = gen_.next_below(10) == 0 ? kStop : 100;
      const std::optional<FinishReason> reason = scheduler_.accept(*s, token);
      EXPECT_LE(s->generated, s->max_new_tokens);
      EXPECT_LE(s->prompt_tokens + s->generated, limits_.window + 1);
      if (token == kStop) {
        EXPECT_EQ(reason, FinishReason::eos);
      }
      if (reason) end(scheduler_.finish(s)->id);
    }
  }

  void end(uint64_t id) {
    EXPECT_TRUE(ended_.insert(id).second) << "sequence " << id << " ended twice";
    EXPECT_EQ(live_.erase(id), 1u) << "sequence " << id << " ended but was not live";
  }

  // No waiting request was submitted before one already admitted: nobody passes anybody.
  void check_arrival_order() {
    uint64_t latest_admitted = 0;
    for (uint64_t id : admitted_) latest_admitted = std::max(latest_admitted, id);
    for (uint64_t id : live_) {
      const bool admitted = std::find(admitted_.begin(), admitted_.end(), id) != admitted_.end();
      if (!admitted) {
        EXPECT_GT(id, latest_admitted) << "request " << id << " was passed by a later one";
      }
    }
  }

  void check_prefill(const PrefillPlan& plan) {
    ASSERT_FALSE(plan.sequences.empty());
    for (const SequenceState* s : plan.sequences) EXPECT_FALSE(s->decoding);
    if (plan.whole_prompts) {
      EXPECT_LE(plan.rows * plan.length, std::max(limits_.prefill_chunk, plan.length));
      EXPECT_GE(plan.rows, static_cast<int64_t>(plan.sequences.size()));
      for (const SequenceState* s : plan.sequences) {
        EXPECT_EQ(s->cached, 0);
        EXPECT_LE(s->prompt_tokens, plan.length);
        EXPECT_LE(s->prompt_tokens, limits_.prefill_chunk);
      }
    } else {
      ASSERT_EQ(plan.sequences.size(), 1u);
      const SequenceState& s = *plan.sequences[0];
      EXPECT_EQ(plan.start, s.cached);
      EXPECT_GE(plan.count, 1);
      EXPECT_LE(plan.count, limits_.prefill_chunk);
      EXPECT_EQ(plan.last, plan.start + plan.count == s.prompt_tokens);
      EXPECT_LE(plan.start + plan.count, static_cast<int64_t>(s.blocks.size()) * limits_.block_size);
    }
  }

  void check_decode(const DecodePlan& plan) {
    int64_t highest = -1, longest = 0;
    bool greedy = true;
    for (const SequenceState* s : plan.fed) {
      EXPECT_TRUE(s->decoding);
      EXPECT_LT(s->cached, static_cast<int64_t>(s->blocks.size()) * limits_.block_size)
          << "a step would write past the sequence's blocks";
      EXPECT_LT(s->generated + s->steps_in_flight, s->max_new_tokens) << "fed past its budget";
      highest = std::max(highest, s->row);
      longest = std::max(longest, s->cached + 1);
    }
    for (const auto& s : scheduler_.running()) {
      if (s->decoding && s->row < plan.rows) greedy = greedy && s->greedy;
    }
    EXPECT_GT(plan.rows, highest);
    EXPECT_LE(plan.rows, limits_.max_batch);
    EXPECT_GE(plan.context, longest);
    EXPECT_EQ(plan.greedy_only, greedy);
  }

  void check_state() {
    std::set<int32_t> held;
    std::set<int64_t> rows;
    int64_t used = 0;
    for (const auto& s : scheduler_.running()) {
      EXPECT_EQ(scheduler_.in_row(s->row), s.get());
      EXPECT_TRUE(rows.insert(s->row).second) << "row " << s->row << " held twice";
      EXPECT_EQ(static_cast<int64_t>(s->blocks.size()), blocks_needed(limits_, s->prompt_tokens, s->max_new_tokens));
      for (int32_t b : s->blocks) {
        EXPECT_TRUE(b >= 0 && b < limits_.num_blocks);
        EXPECT_TRUE(held.insert(b).second) << "block " << b << " held twice";
      }
      used += static_cast<int64_t>(s->blocks.size());
      EXPECT_LE(s->cached, static_cast<int64_t>(s->blocks.size()) * limits_.block_size);
    }
    EXPECT_LE(static_cast<int64_t>(rows.size()), limits_.max_batch);
    const SchedulerCounts counts = scheduler_.counts();
    EXPECT_EQ(counts.blocks_used, used);
    EXPECT_LE(counts.blocks_used, counts.blocks_total);
    EXPECT_EQ(counts.prefilling + counts.decoding, static_cast<int64_t>(scheduler_.running().size()));
  }

  SchedulerLimits limits_;
  Scheduler scheduler_;
  Generator gen_;
  std::set<uint64_t> live_, ended_;
  std::vector<uint64_t> submitted_, admitted_;
  std::deque<InFlight> in_flight_;
};

SchedulerLimits random_limits(Generator& gen) {
  SchedulerLimits l;
  l.max_batch = 1 + static_cast<int64_t>(gen.next_below(8));
  l.block_size = int64_t{1} << gen.next_below(5);
  l.window = 2 + static_cast<int64_t>(gen.next_below(200));
  l.num_blocks = 1 + static_cast<int64_t>(gen.next_below(3 * static_cast<uint64_t>(l.window / l.block_size + 1)));
  l.prefill_chunk = 1 + static_cast<int64_t>(gen.next_below(64));
  return l;
}

TEST(Scheduler, RandomArrivalsCancellationsAndStopsKeepEveryRule) {
  Generator gen(testing::fresh_seed());
  int64_t steps = 0, requests = 0;
  for (int run = 0; run < 2000; ++run) {
    const SchedulerLimits limits = random_limits(gen);
    SCOPED_TRACE("run " + std::to_string(run) + ": max_batch " + std::to_string(limits.max_batch) + ", block " +
                 std::to_string(limits.block_size) + ", blocks " + std::to_string(limits.num_blocks) + ", window " +
                 std::to_string(limits.window) + ", chunk " + std::to_string(limits.prefill_chunk));
    Simulation sim(limits, gen.next_u64());
    const int arrival_steps = 10 + static_cast<int>(gen.next_below(60));
    const double cancel_rate = gen.next_uniform() * 0.2;
    for (int t = 0; t < arrival_steps; ++t) {
      for (uint64_t n = gen.next_below(3); n > 0; --n) sim.submit_random();
      if (gen.next_uniform() < cancel_rate) sim.cancel_random();
      sim.step();
      ++steps;
      if (::testing::Test::HasFailure()) return;
    }
    // No more arrivals: everything ends, in a bounded number of steps (no request starves).
    int drain = 0;
    while (!sim.idle()) {
      sim.step();
      ++steps;
      ASSERT_LT(++drain, 100000) << sim.live().size() << " requests never ended";
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_TRUE(sim.live().empty());
    EXPECT_EQ(sim.ended(), sim.submitted());
    requests += static_cast<int64_t>(sim.submitted());
  }
  std::cout << requests << " requests over " << steps << " steps\n";
}

// A request that needs most of the pool waits at the head of the queue for blocks; the small requests behind it
// wait too (they would otherwise starve it), and it runs first once the blocks come back.
TEST(Scheduler, ALargeRequestAtTheFrontIsNotPassedBySmallOnes) {
  const SchedulerLimits limits{.max_batch = 4, .block_size = 4, .num_blocks = 10, .window = 64, .prefill_chunk = 8};
  Scheduler s(limits);
  const uint64_t first = s.submit(request(4, 12));   // 4 blocks
  const uint64_t large = s.submit(request(20, 12));  // 8 blocks: waits for the first
  const uint64_t small = s.submit(request(2, 2));    // 1 block: would fit now, but stays behind the large one
  std::vector<SequenceState*> admitted = s.admit();
  ASSERT_EQ(admitted.size(), 1u);
  EXPECT_EQ(admitted[0]->id, first);
  EXPECT_TRUE(s.admit().empty());
  EXPECT_EQ(s.counts().waiting, 2);
  s.finish(admitted[0]);
  admitted = s.admit();
  ASSERT_EQ(admitted.size(), 2u);  // the large one first, then the small one into the blocks left
  EXPECT_EQ(admitted[0]->id, large);
  EXPECT_EQ(admitted[1]->id, small);
  EXPECT_EQ(s.counts().blocks_used, 9);
}

TEST(Scheduler, RequestsThatCanNeverRunAreRefusedAtSubmit) {
  Scheduler s({.max_batch = 2, .block_size = 16, .num_blocks = 4, .window = 128, .prefill_chunk = 32});
  EXPECT_THROW(s.submit(request(0, 4)), ValueError);
  EXPECT_THROW(s.submit(request(4, 0)), ValueError);
  EXPECT_THROW(s.submit(request(128, 1)), ValueError);  // the prompt fills the window
  const std::string m = testing::error_message([&] { s.submit(request(60, 10)); });  // 5 blocks of 4
  EXPECT_NE(m.find("need 5 KV blocks of 16 tokens; the cache has 4 in all"), std::string::npos) << m;
  EXPECT_NO_THROW(s.submit(request(60, 4)));
}

// Whole prompts that fit one chunk together go in one forward; a longer prompt is chunked alone.
TEST(Scheduler, PrefillPlansBatchShortPromptsAndChunkLongOnes) {
  Scheduler s({.max_batch = 8, .block_size = 16, .num_blocks = 64, .window = 512, .prefill_chunk = 64});
  for (int64_t prompt : {10, 12, 30, 100, 5}) s.submit(request(prompt, 8));
  ASSERT_EQ(s.admit().size(), 5u);
  std::optional<PrefillPlan> plan = s.next_prefill();
  ASSERT_TRUE(plan && plan->whole_prompts);
  // 10 and 12 (2 rows of 16), not 30 (4 rows of 32 > 64) nor 100 (past a chunk), then 5 (4 rows of 16).
  ASSERT_EQ(plan->sequences.size(), 3u);
  EXPECT_EQ(plan->sequences[2]->prompt_tokens, 5);
  EXPECT_EQ(plan->rows, 4);
  EXPECT_EQ(plan->length, 16);
  s.prefilled(*plan);
  plan = s.next_prefill();
  ASSERT_TRUE(plan && plan->whole_prompts);
  ASSERT_EQ(plan->sequences.size(), 1u);  // 30 alone (100 is longer than a chunk)
  EXPECT_EQ(plan->rows, 1);
  EXPECT_EQ(plan->length, 32);
  s.prefilled(*plan);
  plan = s.next_prefill();
  ASSERT_TRUE(plan && !plan->whole_prompts);
  EXPECT_EQ(plan->start, 0);
  EXPECT_EQ(plan->count, 64);
  EXPECT_FALSE(plan->last);
  s.prefilled(*plan);
  plan = s.next_prefill();
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->start, 64);
  EXPECT_EQ(plan->count, 36);
  EXPECT_TRUE(plan->last);
  s.prefilled(*plan);
  EXPECT_FALSE(s.next_prefill());
  const std::optional<DecodePlan> decode = s.next_decode();
  ASSERT_TRUE(decode);
  EXPECT_EQ(decode->fed.size(), 5u);
  EXPECT_EQ(decode->rows, 8);
  EXPECT_EQ(decode->context, 256);
}

}  // namespace
}  // namespace microllm::generate
