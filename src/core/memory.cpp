#include "microllm/core/memory.h"

#include <atomic>
#include <mutex>

namespace microllm {
namespace {

constexpr int kDeviceSlots = 17;  // the CPU and cuda:0..15

struct DeviceMemory {
  std::array<std::atomic<int64_t>, kMemoryCategories> live{};
  std::atomic<int64_t> total{0};
  std::atomic<int64_t> peak{0};
  std::mutex peak_mutex;  // taken only when the total passes the peak
  std::array<int64_t, kMemoryCategories> at_peak{};
};

DeviceMemory* slot(Device device) {
  static DeviceMemory slots[kDeviceSlots];
  const int index = device.is_cpu() ? 0 : device.index + 1;
  return index >= 0 && index < kDeviceSlots ? &slots[index] : nullptr;
}

thread_local MemoryCategory t_category = MemoryCategory::other;

}  // namespace

const char* memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::other: return "other";
    case MemoryCategory::weights: return "weights";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::kv_cache: return "kv_cache";
    case MemoryCategory::workspace: return "workspace";
  }
  return "other";
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category) : previous_(t_category) { t_category = category; }
MemoryCategoryScope::~MemoryCategoryScope() { t_category = previous_; }
MemoryCategory current_memory_category() { return t_category; }

MemoryUsage memory_usage(Device device) {
  MemoryUsage usage;
  DeviceMemory* m = slot(device);
  if (!m) return usage;
  for (int c = 0; c < kMemoryCategories; ++c) usage.live[c] = m->live[c].load(std::memory_order_relaxed);
  usage.total = m->total.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(m->peak_mutex);
  usage.peak = m->peak.load(std::memory_order_relaxed);
  usage.at_peak = m->at_peak;
  return usage;
}

void reset_memory_peak(Device device) {
  DeviceMemory* m = slot(device);
  if (!m) return;
  std::lock_guard<std::mutex> lock(m->peak_mutex);
  m->peak.store(m->total.load(std::memory_order_relaxed), std::memory_order_relaxed);
  for (int c = 0; c < kMemoryCategories; ++c) m->at_peak[c] = m->live[c].load(std::memory_order_relaxed);
}

namespace detail {
void charge_memory(Device device, MemoryCategory category, int64_t bytes) {
  DeviceMemory* m = slot(device);
  if (!m || bytes == 0) return;
  m->live[static_cast<int>(category)].fetch_add(bytes, std::memory_order_relaxed);
  const int64_t total = m->total.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes > 0 && total > m->peak.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(m->peak_mutex);
    if (total > m->peak.load(std::memory_order_relaxed)) {
      m->peak.store(total, std::memory_order_relaxed);
      for (int c = 0; c < kMemoryCategories; ++c) m->at_peak[c] = m->live[c].load(std::memory_order_relaxed);
    }
  }
}
}  // namespace detail

}  // namespace microllm
