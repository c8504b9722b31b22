// The CUDA caching allocator. cudaMalloc/cudaFree are slow and synchronize the device, so freed blocks
// are kept and handed out again. A block is reused only on the stream it was last allocated for: work
// on one stream runs in order, so the next user cannot start before the previous user finished.
//
// CUDA graphs: while a thread captures a graph into a private pool (GraphPoolScope), its allocations come
// from that pool and its blocks go back to it when freed, whenever that happens. A graph replays the
// addresses it recorded, so they must never be handed to other work between replays: blocks of a private
// pool are only ever reused by later captures into the same pool, and go back to the driver only with
// release_graph_pool().
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "../device_runtime.h"
#include "cuda_check.h"
#include "microllm/core/cuda.h"

namespace microllm::detail {
namespace {

// The private graph pool this thread allocates from (0: the shared pool).
thread_local uint64_t t_graph_pool = 0;

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }
size_t block_size_for(size_t nbytes) {
  return nbytes < kSmallLimit ? round_up(nbytes, kSmallRound) : round_up(nbytes, kLargeRound);
}

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = block_size_for(nbytes);
    const PoolKey pool{current_cuda_stream(device_), t_graph_pool};
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.requests;
    auto [ptr, block_size] = take_cached(pool, size);
    if (ptr) {
      ++stats_.cache_hits;
    } else {
      ptr = malloc_from_driver(size);
      block_size = size;
    }
    active_[ptr] = Block{block_size, pool};
    stats_.allocated_bytes += block_size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return ptr;
  }

  void deallocate(void* ptr, size_t) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = active_.find(ptr);
    if (it == active_.end()) return;  // not ours: never happens through Storage
    stats_.allocated_bytes -= it->second.size;
    free_[it->second.pool].emplace(it->second.size, ptr);
    active_.erase(it);
  }

  Device device() const override { return Device::cuda(device_); }
  const char* name() const override { return "cuda caching allocator"; }

  cuda::AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached();
  }
  void release_graph_pool(uint64_t graph_pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached(graph_pool);
  }

 private:
  using PoolKey = std::pair<cudaStream_t, uint64_t>;  // stream, graph pool (0: shared)
  struct Block {
    size_t size;
    PoolKey pool;
  };

  // A free block of this pool (and its size) that fits without wasting more than a quarter of it.
  std::pair<void*, size_t> take_cached(const PoolKey& key, size_t size) {
    auto pool = free_.find(key);
    if (pool == free_.end()) return {nullptr, 0};
    const auto it = pool->second.lower_bound(size);
    if (it == pool->second.end() || it->first > size + size / 4) return {nullptr, 0};
    const std::pair<void*, size_t> block{it->second, it->first};
    pool->second.erase(it);
    return block;
  }

  void* malloc_from_driver(size_t size) {
    CudaDeviceGuard guard(device_);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();  // give the shared cache back to the driver and try once more
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemoryError("cuda allocator", str_cat("cudaMalloc of ", size, " bytes on cuda:", device_,
                                                       " failed (", cudaGetErrorString(status), "); allocated ",
                                                       stats_.allocated_bytes, " bytes, reserved ",
                                                       stats_.reserved_bytes, " bytes"));
    }
    ++stats_.backend_allocs;
    stats_.reserved_bytes += size;
    return ptr;
  }

  // Returns the free blocks of one graph pool (0: of the shared pools, the graphs' stay) to the driver.
  void release_cached(uint64_t graph_pool = 0) {
    CudaDeviceGuard guard(device_);
    for (auto& [key, pool] : free_) {
      if (key.second != graph_pool) continue;
      for (auto& [size, ptr] : pool) {
        MICROLLM_CUDA_CHECK(cudaFree(ptr));  // cudaFree waits for work that may still use the block
        ++stats_.backend_frees;
        stats_.reserved_bytes -= size;
      }
      pool.clear();
    }
  }

  int device_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> active_;
  std::map<PoolKey, std::multimap<size_t, void*>> free_;
  cuda::AllocatorStats stats_;
};

constexpr int kMaxDevices = 64;
std::mutex g_allocators_mutex;
// Never destroyed: freeing device memory during static destruction races the CUDA driver's own teardown.
std::array<CachingAllocator*, kMaxDevices> g_allocators{};

CachingAllocator& allocator_of(int device) {
  MICROLLM_CHECK(device >= 0 && device < cuda_device_count_impl() && device < kMaxDevices, DeviceError, "cuda",
                 "no CUDA device ", device, " (this machine has ", cuda_device_count_impl(), ")");
  std::lock_guard<std::mutex> lock(g_allocators_mutex);
  auto& slot = g_allocators[static_cast<size_t>(device)];
  if (!slot) slot = new CachingAllocator(device);
  return *slot;
}

}  // namespace

Allocator& cuda_allocator(int device) { return allocator_of(device); }

GraphPoolScope::GraphPoolScope(uint64_t pool) : previous_(t_graph_pool) { t_graph_pool = pool; }
GraphPoolScope::~GraphPoolScope() { t_graph_pool = previous_; }

void cuda_fill_bytes(void* dst, int device, int byte, size_t nbytes) {
  CudaDeviceGuard guard(device);
  MICROLLM_CUDA_CHECK(cudaMemsetAsync(dst, byte, nbytes, current_cuda_stream(device)));
}

}  // namespace microllm::detail

namespace microllm::cuda {

AllocatorStats allocator_stats(int device) { return detail::allocator_of(device).stats(); }
void reset_peak_allocated(int device) { detail::allocator_of(device).reset_peak(); }
void empty_cache(int device) { detail::allocator_of(device).empty_cache(); }

uint64_t create_graph_pool() {
  static std::atomic<uint64_t> next{1};
  return next++;
}
void release_graph_pool(int device, uint64_t pool) { detail::allocator_of(device).release_graph_pool(pool); }

}  // namespace microllm::cuda
