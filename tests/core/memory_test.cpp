// Memory by category (core/memory.h): allocations charged to the thread's category and credited back when freed,
// nested scopes, the breakdown at the peak, borrowed memory not counted (the library's own categories:
// tests/nn/transformer_test.cpp, tests/profile/trace_test.cpp).
#include "microllm/core/memory.h"

#include <gtest/gtest.h>

#include <vector>

#include "microllm/core/tensor.h"

namespace microllm {
namespace {

int64_t live(MemoryCategory category) {
  return memory_usage(Device::cpu()).live[static_cast<size_t>(category)];
}

TEST(Memory, AllocationsAreChargedToTheirCategoryUntilFreed) {
  const int64_t weights = live(MemoryCategory::weights), kv = live(MemoryCategory::kv_cache);
  const int64_t other = live(MemoryCategory::other);
  {
    MemoryCategoryScope scope(MemoryCategory::weights);
    EXPECT_EQ(current_memory_category(), MemoryCategory::weights);
    const Tensor a = Tensor::empty({1000}, DType::f32);
    {
      MemoryCategoryScope inner(MemoryCategory::kv_cache);
      const Tensor b = Tensor::empty({10, 10}, DType::bf16);
      EXPECT_EQ(live(MemoryCategory::kv_cache) - kv, 200);
    }
    EXPECT_EQ(current_memory_category(), MemoryCategory::weights);
    EXPECT_EQ(live(MemoryCategory::kv_cache), kv);  // b is freed
    EXPECT_EQ(live(MemoryCategory::weights) - weights, 4000);
    const Tensor view = a.narrow(0, 0, 10);  // a view allocates nothing
    EXPECT_EQ(live(MemoryCategory::weights) - weights, 4000);
  }
  EXPECT_EQ(live(MemoryCategory::weights), weights);
  EXPECT_EQ(current_memory_category(), MemoryCategory::other);
  std::vector<float> host(256);
  const Tensor borrowed = Tensor::from_blob(host.data(), {256}, DType::f32, Device::cpu(), nullptr);
  EXPECT_EQ(live(MemoryCategory::other), other);  // borrowed memory is not ours to count
  EXPECT_STREQ(memory_category_name(MemoryCategory::optimizer_state), "optimizer_state");
}

TEST(Memory, ThePeakKeepsItsBreakdown) {
  reset_memory_peak(Device::cpu());
  const MemoryUsage before = memory_usage(Device::cpu());
  EXPECT_EQ(before.peak, before.total);
  {
    MemoryCategoryScope scope(MemoryCategory::activations);
    const Tensor big = Tensor::empty({1 << 20}, DType::u8);
    MemoryCategoryScope workspace(MemoryCategory::workspace);
    const Tensor scratch = Tensor::empty({1 << 10}, DType::u8);
  }
  const MemoryUsage after = memory_usage(Device::cpu());
  EXPECT_EQ(after.total, before.total);
  EXPECT_EQ(after.peak, before.total + (1 << 20) + (1 << 10));
  EXPECT_EQ(after.at_peak[static_cast<size_t>(MemoryCategory::activations)] -
                before.live[static_cast<size_t>(MemoryCategory::activations)],
            1 << 20);
  EXPECT_EQ(after.at_peak[static_cast<size_t>(MemoryCategory::workspace)] -
                before.live[static_cast<size_t>(MemoryCategory::workspace)],
            1 << 10);
}

}  // namespace
}  // namespace microllm
