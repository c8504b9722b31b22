#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "microllm/backend/op_timing.h"
#include "op_timing_internal.h"

namespace microllm {
namespace {

std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::vector<std::pair<std::string, std::function<double()>>> g_pending;
std::map<std::string, OpTiming> g_totals;

void resolve_pending_locked() {
  for (auto& [op, elapsed] : g_pending) {
    OpTiming& t = g_totals[op];
    t.op = op;
    ++t.calls;
    t.total_ms += elapsed();
  }
  g_pending.clear();
}

}  // namespace

void set_op_timing(bool on) { g_enabled.store(on); }
bool op_timing_enabled() { return g_enabled.load(std::memory_order_relaxed); }

std::vector<OpTiming> op_timings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  resolve_pending_locked();
  std::vector<OpTiming> out;
  for (const auto& [op, t] : g_totals) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTiming& a, const OpTiming& b) { return a.total_ms > b.total_ms; });
  return out;
}

void reset_op_timings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  resolve_pending_locked();  // wait for (and drop) what is in flight
  g_totals.clear();
}

namespace detail {
void record_op_time(const char* op, std::function<double()> elapsed_ms) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pending.emplace_back(op, std::move(elapsed_ms));
}
}  // namespace detail

}  // namespace microllm
