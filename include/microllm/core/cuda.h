// The CUDA runtime as microLLM uses it: devices, streams, events, the caching allocator's statistics
// and the transfer counters. No CUDA header is needed to include this; in a CPU-only build the
// functions that need a GPU throw NotSupportedError and the queries report zero devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace microllm::cuda {

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;          // compute capability
  int multiprocessors = 0;
  size_t total_memory = 0;           // bytes
  size_t l2_cache_bytes = 0;
  size_t shared_memory_per_block_optin = 0;
  int memory_bus_width_bits = 0;
};
DeviceProperties device_properties(int device);
void synchronize(int device);
// What the driver reports now: memory not held by any process or allocator cache, and the total.
struct MemoryInfo {
  size_t free = 0, total = 0;
};
MemoryInfo memory_info(int device);

// A CUDA stream on one device. The default stream of each device is the legacy default stream;
// create() makes an owned, non-blocking stream.
class Stream {
 public:
  Stream() = default;
  static Stream create(int device);
  static Stream default_stream(int device);
  void* handle() const { return handle_; }  // a cudaStream_t
  int device() const { return device_; }
  void synchronize() const;
  // Whether a CUDA graph capture is recording this stream's work (nothing it launches runs now).
  bool capturing() const;
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_ && a.device_ == b.device_; }

 private:
  friend Stream current_stream(int device);
  Stream(void* handle, int device) : handle_(handle), device_(device) {}
  void* handle_ = nullptr;
  int device_ = 0;
};

// The stream ops on `device` launch on from this thread (the default stream unless a guard is active).
Stream current_stream(int device);

// Makes `stream` the current stream of its device on this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A CUDA event with timing enabled.
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  void wait(const Stream& stream) const;  // the stream waits for the event, the host does not
  void synchronize() const;
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* handle_ = nullptr;
  int device_;
};

// The caching allocator: blocks are rounded up (512 B below 1 MiB, 2 MiB above), kept per stream when
// freed, and reused by later requests on the same stream.
struct AllocatorStats {
  size_t allocated_bytes = 0;       // handed out now
  size_t reserved_bytes = 0;        // obtained from cudaMalloc and not yet returned
  size_t peak_allocated_bytes = 0;
  uint64_t requests = 0;            // allocate() calls
  uint64_t cache_hits = 0;          // requests served from the cache
  uint64_t backend_allocs = 0;      // cudaMalloc calls
  uint64_t backend_frees = 0;       // cudaFree calls
};
AllocatorStats allocator_stats(int device);
void reset_peak_allocated(int device);
// Returns every cached (free) block to the driver.
void empty_cache(int device);

// CUDA graphs: the kernels a piece of host code launches, recorded once and replayed with one launch (no
// per-kernel launch cost, no host work per op). A replay repeats the recorded kernels with the recorded
// arguments: the same addresses, shapes and host scalars. What changes between replays (token ids, positions,
// lengths) must therefore live in device buffers that the host rewrites before each replay.
//
// Memory: allocations made during a capture come from a private graph pool (create_graph_pool), so the
// addresses a graph uses are never handed to other work; several graphs that replay on one stream, one at a
// time, may share a pool. release_graph_pool returns a pool's free blocks to the driver once its graphs and
// the tensors they wrote are gone.
uint64_t create_graph_pool();
void release_graph_pool(int device, uint64_t pool);

class Graph {
 public:
  Graph() = default;
  // Runs `work` with `stream` as the current stream of its device, recording instead of executing (so
  // `work` must launch only on that stream and must not synchronize or copy to the host). `stream` must be
  // a created stream, not the legacy default stream. Nothing has run when capture returns.
  static Graph capture(const Stream& stream, uint64_t pool, const std::function<void()>& work);
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool empty() const { return exec_ == nullptr; }
  // Launches the recorded kernels on the stream they were captured on.
  void replay() const;
  const Stream& stream() const { return stream_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  Stream stream_;
};

// Page-locked host memory: the host side of copies the host does not wait for (copy_async). A decode loop
// keeps the GPU busy with its next step while the host reads the tokens of the one before through it.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  // The same memory as kernels address it (mapped: a kernel may write it, and the host reads what it wrote
  // once the kernel's work is synchronized, e.g. an Event recorded after it).
  void* device_data() const;
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Enqueues a copy of `bytes` between pinned host memory (a PinnedBuffer) and device memory, either way, on
// `stream` and returns at once. The host must leave the pinned side alone until the stream has passed the copy
// (record an Event after it). Counted in transfer_stats like every other copy.
enum class CopyDirection { host_to_device, device_to_host };
void copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction, const Stream& stream);

// Uploads the host does not wait for. A plain host-to-device copy (Tensor::to, from_vector) waits for its
// stream, so a loop that uploads a few ids before each batch of kernels lets the device's queue drain every
// time; upload() instead copies the source into page-locked memory owned here, enqueues the copy on `stream`
// and returns, and the caller may change its source at once. The pinned memory is two arenas used in turn:
// an arena is written again only after the stream has passed its last copy (an event recorded after each),
// which, at the arenas' size, is long done when it comes round; an upload larger than an arena grows it.
class UploadStaging {
 public:
  explicit UploadStaging(const Stream& stream, size_t arena_bytes = size_t{1} << 20);
  ~UploadStaging();
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // Enqueues the copy of `bytes` from host memory `src` to device memory `dst` on the stream.
  void upload(void* dst, const void* src, size_t bytes);
  const Stream& stream() const { return stream_; }
  // How often an upload synchronized with an arena's last copy (a wait, if it had not run yet), and how often
  // an arena grew (tests).
  uint64_t waits() const { return waits_; }
  uint64_t grows() const { return grows_; }

 private:
  struct Arena;
  Stream stream_;
  size_t arena_bytes_;
  std::unique_ptr<Arena[]> arenas_;  // [2]
  int current_ = 0;
  uint64_t waits_ = 0, grows_ = 0;
};

// Bytes moved between host and devices through microLLM, for tests that prove an op moved none.
struct TransferStats {
  uint64_t host_to_device = 0, host_to_device_bytes = 0;
  uint64_t device_to_host = 0, device_to_host_bytes = 0;
  uint64_t device_to_device = 0, device_to_device_bytes = 0;
};
TransferStats transfer_stats();
void reset_transfer_stats();

}  // namespace microllm::cuda
