#include "microllm/core/storage.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "device_runtime.h"
#include "microllm/core/error.h"

namespace microllm {
namespace {

std::atomic<bool> g_poison{false};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    constexpr size_t kAlignment = 64;  // a cache line; enough for any SIMD load
    const size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    if (!ptr) throw OutOfMemoryError("cpu allocator", str_cat("could not allocate ", nbytes, " bytes"));
    return ptr;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
  const char* name() const override { return "cpu"; }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return detail::cuda_allocator(device.index);
}

bool cuda_available() { return detail::cuda_device_count_impl() > 0; }
int cuda_device_count() { return detail::cuda_device_count_impl(); }

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  return allocate(nbytes, allocator_for(device));
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Allocator& allocator) {
  void* data = allocator.allocate(nbytes);
  const Device device = allocator.device();
  if (g_poison.load(std::memory_order_relaxed) && nbytes > 0) {
    if (device.is_cpu()) std::memset(data, 0xff, nbytes);
    else detail::cuda_fill_bytes(data, device.index, 0xff, nbytes);
  }
  const MemoryCategory category = current_memory_category();
  detail::charge_memory(device, category, static_cast<int64_t>(nbytes));
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, &allocator, nullptr, category));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device, std::shared_ptr<void> keep_alive) {
  return std::shared_ptr<Storage>(
      new Storage(data, nbytes, device, nullptr, std::move(keep_alive), MemoryCategory::other));
}

Storage::~Storage() {
  if (allocator_ && data_) {
    allocator_->deallocate(data_, nbytes_);
    detail::charge_memory(device_, category_, -static_cast<int64_t>(nbytes_));
  }
}

void set_poison_new_allocations(bool on) { g_poison.store(on, std::memory_order_relaxed); }
bool poison_new_allocations() { return g_poison.load(std::memory_order_relaxed); }

}  // namespace microllm
