// Devices, streams and events.
#include <array>
#include <utility>

#include "../device_runtime.h"
#include "cuda_check.h"
#include "device_errors.h"
#include "microllm/core/cuda.h"

namespace microllm {
namespace detail {

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for a query
    return 0;
  }
  return count;
}

namespace {
constexpr int kMaxCudaDevices = 64;
// Per thread: the current stream of each device (null = the legacy default stream).
thread_local std::array<cudaStream_t, kMaxCudaDevices> t_current_streams{};

void check_device(int device) {
  MICROLLM_CHECK(device >= 0 && device < cuda_device_count_impl() && device < kMaxCudaDevices, DeviceError, "cuda",
                 "no CUDA device ", device, " (this machine has ", cuda_device_count_impl(), ")");
}
}  // namespace

cudaStream_t current_cuda_stream(int device) {
  MICROLLM_CHECK(device >= 0 && device < kMaxCudaDevices, DeviceError, "cuda", "device index ", device, " out of range");
  return t_current_streams[static_cast<size_t>(device)];
}

}  // namespace detail

namespace cuda {

DeviceProperties device_properties(int device) {
  detail::check_device(device);
  cudaDeviceProp prop{};
  MICROLLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceProperties out;
  out.name = prop.name;
  out.major = prop.major;
  out.minor = prop.minor;
  out.multiprocessors = prop.multiProcessorCount;
  out.total_memory = prop.totalGlobalMem;
  out.l2_cache_bytes = static_cast<size_t>(prop.l2CacheSize);
  out.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  out.memory_bus_width_bits = prop.memoryBusWidth;
  return out;
}

MemoryInfo memory_info(int device) {
  detail::check_device(device);
  detail::CudaDeviceGuard guard(device);
  MemoryInfo out;
  MICROLLM_CUDA_CHECK(cudaMemGetInfo(&out.free, &out.total));
  return out;
}

void synchronize(int device) {
  detail::check_device(device);
  detail::CudaDeviceGuard guard(device);
  MICROLLM_CUDA_CHECK(cudaDeviceSynchronize());
  detail::check_cuda_device_errors(device);
}

Stream Stream::create(int device) {
  detail::check_device(device);
  detail::CudaDeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  MICROLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Streams live as long as the process: handles are cheap to copy and never dangle.
  return Stream(stream, device);
}

Stream Stream::default_stream(int device) {
  detail::check_device(device);
  return Stream(nullptr, device);
}

void Stream::synchronize() const {
  detail::CudaDeviceGuard guard(device_);
  MICROLLM_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
  detail::check_cuda_device_errors(device_);
}

bool Stream::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MICROLLM_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(handle_), &status));
  return status != cudaStreamCaptureStatusNone;
}

Stream current_stream(int device) {
  detail::check_device(device);
  return Stream(detail::current_cuda_stream(device), device);
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  detail::t_current_streams[static_cast<size_t>(stream.device())] = static_cast<cudaStream_t>(stream.handle());
}

StreamGuard::~StreamGuard() {
  detail::t_current_streams[static_cast<size_t>(previous_.device())] = static_cast<cudaStream_t>(previous_.handle());
}

Event::Event(int device) : device_(device) {
  detail::check_device(device);
  detail::CudaDeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  MICROLLM_CUDA_CHECK(cudaEventCreate(&event));
  handle_ = event;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::record(const Stream& stream) {
  detail::CudaDeviceGuard guard(device_);
  MICROLLM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle())));
}

void Event::wait(const Stream& stream) const {
  detail::CudaDeviceGuard guard(stream.device());
  MICROLLM_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle()), static_cast<cudaEvent_t>(handle_), 0));
}

void Event::synchronize() const {
  MICROLLM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
  detail::check_cuda_device_errors(device_);
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  MICROLLM_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

Graph Graph::capture(const Stream& stream, uint64_t pool, const std::function<void()>& work) {
  MICROLLM_CHECK(stream.handle() != nullptr, ValueError, "cuda graph",
                 "capture needs a created stream (Stream::create), not the legacy default stream");
  MICROLLM_CHECK(pool != 0, ValueError, "cuda graph", "capture needs a pool from create_graph_pool()");
  detail::CudaDeviceGuard device(stream.device());
  const auto handle = static_cast<cudaStream_t>(stream.handle());
  Graph out;
  out.stream_ = stream;
  {
    StreamGuard current(stream);
    detail::GraphPoolScope memory(pool);
    // Relaxed: the allocator may still call cudaMalloc for a block the pool lacks (not a stream operation,
    // so it is safe here; the other modes forbid it).
    MICROLLM_CUDA_CHECK(cudaStreamBeginCapture(handle, cudaStreamCaptureModeRelaxed));
    try {
      work();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(handle, &broken);  // leave the stream usable; the error that matters is work's
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    cudaGraph_t graph = nullptr;
    MICROLLM_CUDA_CHECK(cudaStreamEndCapture(handle, &graph));
    out.graph_ = graph;
  }
  cudaGraphExec_t exec = nullptr;
  MICROLLM_CUDA_CHECK(cudaGraphInstantiate(&exec, static_cast<cudaGraph_t>(out.graph_), 0));
  out.exec_ = exec;
  return out;
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

Graph::Graph(Graph&& other) noexcept : graph_(other.graph_), exec_(other.exec_), stream_(other.stream_) {
  other.graph_ = other.exec_ = nullptr;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    std::swap(stream_, other.stream_);
  }
  return *this;
}

void Graph::replay() const {
  MICROLLM_CHECK(exec_ != nullptr, ValueError, "cuda graph", "replay of an empty graph (nothing was captured)");
  detail::CudaDeviceGuard device(stream_.device());
  MICROLLM_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream_.handle())));
}

}  // namespace cuda
}  // namespace microllm
