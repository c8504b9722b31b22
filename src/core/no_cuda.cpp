// CPU-only builds: every CUDA entry point says clearly that this build has no CUDA, and the queries
// report zero devices.
#include "device_runtime.h"
#include "microllm/core/cuda.h"
#include "microllm/core/error.h"

namespace microllm {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw NotSupportedError(what, "this build of microLLM has no CUDA support (configure with -DMICROLLM_CUDA=ON, "
                                "e.g. the cuda-release preset)");
}
}  // namespace

namespace detail {
int cuda_device_count_impl() { return 0; }
Allocator& cuda_allocator(int) { no_cuda("cuda allocator"); }
void cuda_copy_bytes(void*, Device, const void*, Device, size_t) { no_cuda("copy"); }
void cuda_fill_bytes(void*, int, int, size_t) { no_cuda("fill"); }
void cuda_fill(const Tensor&, double) { no_cuda("fill"); }
void cuda_copy_strided(const Tensor&, const Tensor&) { no_cuda("copy"); }
}  // namespace detail

namespace cuda {
DeviceProperties device_properties(int) { no_cuda("cuda"); }
void synchronize(int) { no_cuda("cuda"); }
MemoryInfo memory_info(int) { no_cuda("cuda"); }
Stream Stream::create(int) { no_cuda("cuda"); }
Stream Stream::default_stream(int) { no_cuda("cuda"); }
void Stream::synchronize() const { no_cuda("cuda"); }
bool Stream::capturing() const { no_cuda("cuda"); }
Stream current_stream(int) { no_cuda("cuda"); }
StreamGuard::StreamGuard(const Stream&) { no_cuda("cuda"); }
StreamGuard::~StreamGuard() = default;
Event::Event(int device) : device_(device) { no_cuda("cuda"); }
Event::~Event() = default;
void Event::record(const Stream&) { no_cuda("cuda"); }
void Event::wait(const Stream&) const { no_cuda("cuda"); }
void Event::synchronize() const { no_cuda("cuda"); }
float Event::elapsed_ms(const Event&, const Event&) { no_cuda("cuda"); }
AllocatorStats allocator_stats(int) { no_cuda("cuda"); }
void reset_peak_allocated(int) { no_cuda("cuda"); }
void empty_cache(int) { no_cuda("cuda"); }
uint64_t create_graph_pool() { no_cuda("cuda graph"); }
void release_graph_pool(int, uint64_t) { no_cuda("cuda graph"); }
Graph Graph::capture(const Stream&, uint64_t, const std::function<void()>&) { no_cuda("cuda graph"); }
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept {}
Graph& Graph::operator=(Graph&&) noexcept { return *this; }
void Graph::replay() const { no_cuda("cuda graph"); }
PinnedBuffer::PinnedBuffer(size_t) { no_cuda("pinned memory"); }
PinnedBuffer::~PinnedBuffer() = default;
void* PinnedBuffer::device_data() const { return nullptr; }
PinnedBuffer::PinnedBuffer(PinnedBuffer&&) noexcept {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&&) noexcept { return *this; }
void copy_async(void*, const void*, size_t, CopyDirection, const Stream&) { no_cuda("copy"); }
struct UploadStaging::Arena {};
UploadStaging::UploadStaging(const Stream&, size_t) { no_cuda("pinned memory"); }
UploadStaging::~UploadStaging() = default;
void UploadStaging::upload(void*, const void*, size_t) { no_cuda("copy"); }

TransferStats transfer_stats() { return {}; }
void reset_transfer_stats() {}
}  // namespace cuda

}  // namespace microllm
