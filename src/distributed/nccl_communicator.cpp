// The NCCL communicator: collectives on CUDA tensors, on a communication stream of its own.
//
// Ordering: each collective first makes the communication stream wait for everything already queued on
// the caller's current stream (an event), so it reads the values the compute stream produced; wait() makes
// the current stream wait for the collective. The host is not needed for either, but wait() does watch the
// collective: it polls its completion event and the communicator's asynchronous error, and gives up after
// the timeout (ncclCommAbort, then BackendError), so a dead or stuck peer becomes an error instead of a hang.
// The communicator is non-blocking (ncclConfig_t.blocking = 0): initialization and every call that returns
// ncclInProgress are polled the same way.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "distributed/checks.h"
#include "microllm/distributed/communicator.h"

namespace microllm::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Live communicators, for abort_job.
std::mutex g_registry_mutex;
std::set<ncclComm_t> g_registry;

[[noreturn]] void throw_nccl(ncclResult_t result, ncclComm_t comm, const char* call, int rank, const char* file,
                             int line) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  throw BackendError("nccl", str_cat(call, " failed on rank ", rank, ": ", ncclGetErrorString(result),
                                     last != nullptr && *last != '\0' ? str_cat(" (", last, ")") : std::string(),
                                     " at ", file, ":", line));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    default: throw DTypeError("nccl", str_cat("no NCCL reduction for ", dtype));
  }
}

// Aborts a live communicator exactly once: it must leave the registry first, or abort_job and the destructor
// would abort (free) it a second time.
void abort_once(ncclComm_t comm) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  if (g_registry.erase(comm) > 0) ncclCommAbort(comm);
}

// Polls a non-blocking communicator until its state leaves ncclInProgress: ncclSuccess returns, an error or
// the timeout throws (after aborting the communicator, which every later call then reports).
void wait_ready(ncclComm_t comm, ncclResult_t result, const char* call, int rank, double timeout_seconds,
                const char* file, int line) {
  const auto start = Clock::now();
  while (result == ncclInProgress) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_seconds) {
      abort_once(comm);
      throw BackendError("nccl", str_cat(call, " on rank ", rank, " did not complete within ", timeout_seconds,
                                         " s (a peer is gone or stuck); the communicator was aborted"));
    }
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
  }
  if (result != ncclSuccess) throw_nccl(result, comm, call, rank, file, line);
}

#define MICROLLM_NCCL_CALL(call) wait_ready(comm_, (call), #call, rank_, timeout_, __FILE__, __LINE__)

// A timing event recorded on a stream (profiling only: Communicator::set_timing).
class CudaMark final : public TimeMark {
 public:
  CudaMark(int device, cudaStream_t stream) : device_(device) {
    ::microllm::detail::CudaDeviceGuard guard(device_);
    MICROLLM_CUDA_CHECK(cudaEventCreate(&event_));
    MICROLLM_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~CudaMark() override { cudaEventDestroy(event_); }
  CudaMark(const CudaMark&) = delete;
  CudaMark& operator=(const CudaMark&) = delete;
  double seconds_since(const TimeMark& earlier) const override {
    const auto* other = dynamic_cast<const CudaMark*>(&earlier);
    MICROLLM_CHECK(other != nullptr && other->device_ == device_, ValueError, "TimeMark",
                   "a CUDA mark compares with marks of its own device only");
    ::microllm::detail::CudaDeviceGuard guard(device_);
    MICROLLM_CUDA_CHECK(cudaEventSynchronize(other->event_));
    MICROLLM_CUDA_CHECK(cudaEventSynchronize(event_));
    float ms = 0;
    MICROLLM_CUDA_CHECK(cudaEventElapsedTime(&ms, other->event_, event_));
    return ms * 1e-3;
  }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* owner, cudaEvent_t done, std::vector<Tensor> keep_alive,
           std::unique_ptr<TimeMark> started, std::unique_ptr<TimeMark> ended)
      : owner_(owner),
        done_(done),
        keep_alive_(std::move(keep_alive)),
        started_(std::move(started)),
        ended_(std::move(ended)) {}
  ~NcclWork() override;
  void wait() override;
  bool test() override {
    if (waited_) return true;
    return cudaEventQuery(done_) == cudaSuccess;
  }
  const TimeMark* started() const override { return started_.get(); }
  const TimeMark* ended() const override { return ended_.get(); }

 private:
  NcclCommunicator* owner_;
  cudaEvent_t done_;
  std::vector<Tensor> keep_alive_;  // the tensors the collective reads and writes live until it is done
  std::unique_ptr<TimeMark> started_, ended_;  // timing on: events on the communication stream around the call
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const LaunchInfo& launch, Device device, double timeout_seconds)
      : device_(device), rank_(launch.rank), world_(launch.world_size), timeout_(timeout_seconds) {
    MICROLLM_CHECK(device.is_cuda(), DeviceError, "nccl", "NCCL needs a CUDA device, got ", device);
    ::microllm::detail::CudaDeviceGuard guard(device.index);
    // The unique id: made by rank 0, sent to the others through MPI (under mpirun) or the TCP rendezvous.
    ncclUniqueId id{};
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw_nccl(r, nullptr, "ncclGetUniqueId", rank_, __FILE__, __LINE__);
    }
    if (world_ > 1) {
      std::string bytes(reinterpret_cast<const char*>(&id), sizeof(id));
      if (launch.launcher == "mpirun") {
        mpi_ = make_mpi_communicator();
        const Tensor buffer = Tensor::empty({static_cast<int64_t>(sizeof(id))}, DType::u8);
        std::memcpy(buffer.data_ptr(), bytes.data(), bytes.size());
        mpi_->broadcast(buffer, 0);
        std::memcpy(&id, buffer.data_ptr(), sizeof(id));
      } else {
        bytes = tcp_broadcast(bytes, launch, timeout_);
        MICROLLM_CHECK(bytes.size() == sizeof(id), BackendError, "nccl", "rank 0 sent ", bytes.size(),
                       " bytes for a unique id of ", sizeof(id));
        std::memcpy(&id, bytes.data(), sizeof(id));
      }
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; wait_ready polls with the timeout
    const ncclResult_t init = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    {
      std::lock_guard<std::mutex> lock(g_registry_mutex);
      g_registry.insert(comm_);
    }
    wait_ready(comm_, init, "ncclCommInitRankConfig", rank_, timeout_, __FILE__, __LINE__);
    MICROLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  ~NcclCommunicator() override {
    bool alive = false;  // not aborted by a timeout already
    {
      std::lock_guard<std::mutex> lock(g_registry_mutex);
      alive = g_registry.erase(comm_) > 0;
    }
    if (alive) {
      try {
        ::microllm::detail::CudaDeviceGuard guard(device_.index);
        MICROLLM_NCCL_CALL(ncclCommFinalize(comm_));  // flushes what was issued, with the timeout
        ncclCommDestroy(comm_);
      } catch (...) {
        ncclCommAbort(comm_);  // finalizing failed or hung: free the resources regardless
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return device_; }
  double timeout() const { return timeout_; }
  ncclComm_t comm() const { return comm_; }

  std::unique_ptr<Work> all_reduce_async(const Tensor& tensor, ReduceOp op) override {
    detail::check_tensor(tensor, device_, "all_reduce", true);
    return enqueue(tensor, [&] {
      MICROLLM_NCCL_CALL(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                                       nccl_type(tensor.dtype()), op == ReduceOp::avg ? ncclAvg : ncclSum, comm_,
                                       stream_));
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) override {
    detail::check_tensor(input, device_, "reduce_scatter", true);
    detail::check_tensor(output, device_, "reduce_scatter", true);
    detail::check_blocks(input, output, world_, "reduce_scatter");
    return enqueue(input, [&] {
      MICROLLM_NCCL_CALL(ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                           nccl_type(input.dtype()), op == ReduceOp::avg ? ncclAvg : ncclSum, comm_,
                                           stream_));
    }, output);
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override {
    detail::check_tensor(input, device_, "all_gather", false);
    detail::check_tensor(output, device_, "all_gather", false);
    detail::check_blocks(output, input, world_, "all_gather");
    // In place when input is block `rank` of output, which NCCL accepts as it is.
    return enqueue(input, [&] {
      MICROLLM_NCCL_CALL(ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm_, stream_));
    }, output);
  }

  void broadcast(const Tensor& tensor, int root) override {
    detail::check_tensor(tensor, device_, "broadcast", false);
    MICROLLM_CHECK(root >= 0 && root < world_, ValueError, "broadcast", "root ", root, " is not a rank of ", world_);
    enqueue(tensor, [&] {
      MICROLLM_NCCL_CALL(
          ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(), ncclUint8, root, comm_, stream_));
    })->wait();
  }

  void barrier() override {
    if (!barrier_.defined()) barrier_ = Tensor::zeros({1}, DType::f32, device_);
    all_reduce_async(barrier_, ReduceOp::sum)->wait();
    ::microllm::detail::CudaDeviceGuard guard(device_.index);
    MICROLLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  [[noreturn]] void abort(const std::string& reason, int exit_code) noexcept override {
    abort_job(reason, exit_code);
  }

  std::unique_ptr<TimeMark> mark() override {
    return std::make_unique<CudaMark>(device_.index, ::microllm::detail::current_cuda_stream(device_.index));
  }

 private:
  // Runs `issue` (one NCCL call on stream_) after the work queued so far on the current stream.
  template <typename F>
  std::unique_ptr<Work> enqueue(const Tensor& tensor, F&& issue, const Tensor& other = Tensor()) {
    ::microllm::detail::CudaDeviceGuard guard(device_.index);
    cudaEvent_t ready = nullptr, done = nullptr;
    MICROLLM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    MICROLLM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MICROLLM_CUDA_CHECK(cudaEventRecord(ready, ::microllm::detail::current_cuda_stream(device_.index)));
    MICROLLM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);  // released once recorded work completes
    std::unique_ptr<TimeMark> started, ended;
    try {
      // Timing: the start event completes when the stream reaches the call (the compute stream's work
      // and the collectives queued before it are done), the end event when the call is done.
      if (timing_) started = std::make_unique<CudaMark>(device_.index, stream_);
      issue();
      if (timing_) ended = std::make_unique<CudaMark>(device_.index, stream_);
    } catch (...) {
      cudaEventDestroy(done);
      throw;
    }
    MICROLLM_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclWork>(this, done, std::vector<Tensor>{tensor, other}, std::move(started),
                                      std::move(ended));
  }

  Device device_;
  int rank_, world_;
  double timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Communicator> mpi_;  // under mpirun: carried the unique id
  Tensor barrier_;
};

NcclWork::~NcclWork() {
  if (!waited_) {
    try {
      wait();
    } catch (...) {
    }
  }
  cudaEventDestroy(done_);
}

void NcclWork::wait() {
  if (waited_) return;
  waited_ = true;
  ::microllm::detail::CudaDeviceGuard guard(owner_->device().index);
  const auto start = Clock::now();
  while (true) {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) MICROLLM_CUDA_CHECK(status);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(owner_->comm(), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort_once(owner_->comm());
      throw_nccl(async, nullptr, "a collective", owner_->rank(), __FILE__, __LINE__);
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > owner_->timeout()) {
      abort_once(owner_->comm());
      throw BackendError("nccl", str_cat("a collective on rank ", owner_->rank(), " of ", owner_->world_size(),
                                         " did not finish within ", owner_->timeout(),
                                         " s (a peer is gone or stuck); the communicator was aborted"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  // Later work on the current stream sees the result (already complete: this costs the GPU nothing).
  MICROLLM_CUDA_CHECK(cudaStreamWaitEvent(::microllm::detail::current_cuda_stream(owner_->device().index), done_, 0));
}

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchInfo& launch, Device device, double timeout_seconds) {
  return std::make_unique<NcclCommunicator>(launch, device, timeout_seconds);
}

namespace detail {
void abort_nccl_communicators() noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (ncclComm_t comm : g_registry) ncclCommAbort(comm);
  g_registry.clear();
}
}  // namespace detail

}  // namespace microllm::distributed
