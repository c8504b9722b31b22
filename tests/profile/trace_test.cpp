// Tracing (microllm/profile/trace.h, summary.h): spans nest per thread and export as Chrome trace-event JSON that
// reads back; a known run (the runner's forwards, a training step) has the layer and op spans it should, as many
// as it should; nothing is recorded outside a session; the summary's tables and the GPU idle gaps of a made-up
// trace; unreadable traces are errors naming the file.
#include "microllm/profile/trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "microllm/autograd/variable.h"
#include "microllm/generate/kv_cache.h"
#include "microllm/generate/runner.h"
#include "microllm/nn/transformer.h"
#include "microllm/profile/summary.h"
#include "test_support.h"

namespace microllm::profile {
namespace {

namespace fs = std::filesystem;

std::map<std::string, int> span_counts(const Trace& trace, const std::string& category = "") {
  std::map<std::string, int> counts;
  for (const Event& e : trace.events) {
    if (e.phase == 'X' && (category.empty() || e.category == category)) ++counts[e.name];
  }
  return counts;
}

// Every two spans of one thread are disjoint or one holds the other.
void expect_nested(const Trace& trace) {
  std::map<std::pair<int, int64_t>, std::vector<const Event*>> by_thread;
  for (const Event& e : trace.events) {
    if (e.phase == 'X') by_thread[{e.pid, e.tid}].push_back(&e);
  }
  for (const auto& [thread, spans] : by_thread) {
    for (const Event* a : spans) {
      for (const Event* b : spans) {
        if (a == b) continue;
        const double a_end = a->ts_us + a->dur_us, b_end = b->ts_us + b->dur_us;
        const bool disjoint = a_end <= b->ts_us || b_end <= a->ts_us;
        const bool a_holds_b = a->ts_us <= b->ts_us && b_end <= a_end;
        const bool b_holds_a = b->ts_us <= a->ts_us && a_end <= b_end;
        EXPECT_TRUE(disjoint || a_holds_b || b_holds_a) << a->name << " and " << b->name << " overlap";
      }
    }
  }
}

TEST(Trace, SpansNestPerThreadAndRoundTripThroughChromeJson) {
  start();
  auto work = [](int rounds) {
    for (int i = 0; i < rounds; ++i) {
      Scope outer("outer", "step");
      outer.arg("round", i);
      Scope inner("inner.", i, ".work", "op");
    }
  };
  std::thread other(work, 3);
  work(2);
  other.join();
  counter("tokens", 7);
  const Trace trace = stop();
  EXPECT_EQ(span_counts(trace)["outer"], 5);
  EXPECT_EQ(span_counts(trace)["inner.0.work"], 2);
  EXPECT_EQ(span_counts(trace)["inner.2.work"], 1);
  expect_nested(trace);

  const nlohmann::json j = nlohmann::json::parse(trace.to_chrome_json());
  ASSERT_TRUE(j["traceEvents"].is_array());
  std::set<int64_t> threads;
  bool counter_seen = false, thread_names = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      threads.insert(e["tid"].get<int64_t>());
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
    counter_seen = counter_seen || (e["ph"] == "C" && e["name"] == "tokens" && e["args"]["value"] == 7);
    thread_names = thread_names || (e["ph"] == "M" && e["name"] == "thread_name");
  }
  EXPECT_EQ(threads.size(), 2u);
  EXPECT_TRUE(counter_seen);
  EXPECT_TRUE(thread_names);

  const fs::path path = fs::temp_directory_path() / ("microllm-trace-" + std::to_string(testing::fresh_seed()) + ".json");
  trace.write(path.string());
  const Trace back = Trace::read(path.string());
  EXPECT_EQ(span_counts(back), span_counts(trace));
  fs::remove(path);
}

TEST(Trace, NothingIsRecordedOutsideASession) {
  { Scope before("before", "op"); }
  EXPECT_FALSE(tracing());
  EXPECT_THROW(stop(), ValueError);
  start();
  EXPECT_THROW(start(), ValueError) << "one session at a time";
  { Scope during("during", "op"); }
  const Trace trace = stop();
  { Scope after("after", "op"); }
  EXPECT_EQ(span_counts(trace), (std::map<std::string, int>{{"during", 1}}));
}

// A known run: two forwards of a 2-layer model through the runner, then one training forward and backward.
TEST(Trace, LayerAndOpSpansOfTheRunnerAndTheTrainingGraph) {
  nn::TransformerConfig c;
  c.vocab_size = 31, c.hidden_size = 16, c.intermediate_size = 24, c.num_layers = 2, c.num_heads = 4;
  c.num_kv_heads = 2, c.max_position_embeddings = 32;
  nn::TransformerLM model(c, testing::fresh_seed());
  const generate::Runner runner(model, DType::f32);
  const Tensor ids = testing::random_tensor({1, 5}, DType::i64, Device::cpu(), 0, 31);
  start();
  {
    generate::ContiguousKvCache cache(c, 1, 8, DType::f32, Device::cpu());
    runner.forward(ids, cache);
    runner.forward(ids.narrow(1, 0, 1).contiguous(), cache);
  }
  const Trace inference = stop();
  const std::map<std::string, int> layers = span_counts(inference, "layer");
  for (const char* name : {"layer.0", "layer.1", "layer.0.attention", "layer.1.mlp"}) {
    EXPECT_EQ(layers.at(name), 2) << name;
  }
  const std::map<std::string, int> ops = span_counts(inference, "op");
  EXPECT_EQ(ops.at("rms_norm_linear"), 2 * 2 * 2) << "qkv and gate_up, per layer, per forward";
  EXPECT_EQ(ops.at("embedding"), 2);
  expect_nested(inference);

  start();
  model.loss(ids, ids, nn::ForwardContext()).backward();
  const Trace training = stop();
  EXPECT_EQ(span_counts(training, "layer").at("layer.1.forward"), 1);
  EXPECT_GT(span_counts(training, "op").at("matmul"), 0);
  EXPECT_GT(span_counts(training, "op").count("rms_norm_backward"), 0u) << "backward ops are spans too";
}

// Memory by category over a trace: samples at span ends ("memory cpu") and the breakdown at the session's peak,
// with the KV cache, the activations of a forward and the weights each in their category.
TEST(Trace, MemoryTimelineAndThePeaksBreakdown) {
  nn::TransformerConfig c;
  c.vocab_size = 31, c.hidden_size = 16, c.intermediate_size = 24, c.num_layers = 2, c.num_heads = 4;
  c.num_kv_heads = 2, c.max_position_embeddings = 64;
  nn::TransformerLM model(c, testing::fresh_seed());
  const generate::Runner runner(model, DType::f32);
  const Tensor ids = testing::random_tensor({1, 40}, DType::i64, Device::cpu(), 0, 31);
  start();
  {
    Scope step("step", "step");
    generate::ContiguousKvCache cache(c, 1, 48, DType::f32, Device::cpu());
    runner.forward(ids, cache);
  }
  const fs::path path = fs::temp_directory_path() / ("microllm-memory-" + std::to_string(testing::fresh_seed()) + ".json");
  stop().write(path.string());
  const Trace trace = Trace::read(path.string());  // the counters survive the Chrome JSON
  fs::remove(path);
  int samples = 0;
  for (const Event& e : trace.events) samples += e.phase == 'C' && e.name == "memory cpu";
  EXPECT_GE(samples, 2) << "at least the layers' and the step's ends";
  const TraceSummary summary = summarize(trace);
  ASSERT_EQ(summary.memory.size(), 1U);
  const MemoryPeak& cpu = summary.memory[0];
  EXPECT_EQ(cpu.device, "cpu");
  std::map<std::string, double> at_peak(cpu.at_peak_mib.begin(), cpu.at_peak_mib.end());
  const double kv_bytes = 2.0 * 2 * 1 * 2 * 48 * 4 * 4;  // layers x (K, V) x [B, Hkv, capacity, D] x f32
  EXPECT_GE(at_peak.at("kv_cache") * 1024 * 1024, kv_bytes);
  EXPECT_GT(at_peak.at("weights"), 0);
  EXPECT_GT(at_peak.at("activations"), 0);
  EXPECT_NE(to_markdown(summary).find("## Memory of cpu at its peak"), std::string::npos);
}

// A made-up trace: the tables, and a GPU's idle gap with the host span open in it.
TEST(TraceSummary, TablesAndGpuIdleGaps) {
  Trace trace;
  auto span = [&](const char* name, const char* category, double ts, double dur, int pid = 0) {
    trace.events.push_back(Event{'X', name, category, ts, dur, pid, 1, {}});
  };
  span("engine.step", "engine", 0, 1000);
  span("matmul", "op", 100, 200);
  span("matmul", "op", 400, 100);
  span("layer.0", "layer", 50, 500);
  span("engine.read", "engine", 600, 300);  // the host reads while the GPU waits
  span("kernel a", "op", 100, 350, 1);
  span("kernel b", "op", 800, 100, 1);  // idle 450..800
  const TraceSummary s = summarize(trace, 5);
  EXPECT_DOUBLE_EQ(s.wall_ms, 1.0);
  ASSERT_FALSE(s.top.empty());
  EXPECT_EQ(s.top.front().name, "engine.step");
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops.front().name, "kernel a");  // 350 us, over the two matmuls' 300
  ASSERT_EQ(s.gpus.size(), 1u);
  EXPECT_DOUBLE_EQ(s.gpus[0].busy_ms, 0.45);
  EXPECT_DOUBLE_EQ(s.gpus[0].idle_ms, 0.35);
  ASSERT_EQ(s.gpus[0].largest_gaps.size(), 1u);
  EXPECT_EQ(s.gpus[0].largest_gaps[0].host_span, "engine.read");
  const std::string md = to_markdown(s);
  EXPECT_NE(md.find("| engine.read |"), std::string::npos) << md;
}

TEST(Trace, UnreadableTracesNameTheFile) {
  const fs::path path = fs::temp_directory_path() / ("microllm-bad-trace-" + std::to_string(testing::fresh_seed()));
  std::ofstream(path) << "{\"traceEvents\": 5}";
  const std::string m = testing::error_message([&] { Trace::read(path.string()); });
  EXPECT_NE(m.find(path.string()), std::string::npos) << m;
  std::ofstream(path) << "not json";
  EXPECT_THROW(Trace::read(path.string()), ParseError);
  fs::remove(path);
  EXPECT_THROW(Trace::read(path.string()), IoError);
}

}  // namespace
}  // namespace microllm::profile
