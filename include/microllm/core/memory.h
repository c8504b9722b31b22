// What device memory is for. Every allocation a Storage makes is charged to the category in effect on its thread
// (a MemoryCategoryScope; "other" outside any) and credited back when the storage is freed, so that each device
// knows its live bytes by category and the breakdown at the moment its total peaked. Always on: two relaxed
// atomic adds per allocation. The trainer, the loader, the KV caches and the runner set the categories; traces
// sample them (profile/trace.h) and `microllm trace summarize` prints the peak's breakdown.
#pragma once

#include <array>
#include <cstdint>

#include "microllm/core/device.h"

namespace microllm {

enum class MemoryCategory : uint8_t { other, weights, activations, gradients, optimizer_state, kv_cache, workspace };
inline constexpr int kMemoryCategories = 7;
const char* memory_category_name(MemoryCategory category);  // "weights", "optimizer_state", ...

// Allocations on this thread are charged to `category` while the scope lives (scopes nest).
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory category);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
};
MemoryCategory current_memory_category();

struct MemoryUsage {
  std::array<int64_t, kMemoryCategories> live{};     // bytes of live storages, by category
  int64_t total = 0;                                 // their sum
  int64_t peak = 0;                                  // the largest total since the last reset
  std::array<int64_t, kMemoryCategories> at_peak{};  // live bytes by category when the total peaked
};
// The usage of a device (the CPU, or cuda:N for N below 16; others report nothing).
MemoryUsage memory_usage(Device device);
// Starts a new peak from the current total.
void reset_memory_peak(Device device);

namespace detail {
// Called by Storage when it allocates and frees owned memory.
void charge_memory(Device device, MemoryCategory category, int64_t bytes);
}  // namespace detail

}  // namespace microllm
