// The backend-independent part of the communicators: argument checks, the factory, and the local
// communicator (a world of one).
#include "microllm/distributed/communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "distributed/checks.h"

namespace microllm::distributed {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "avg"; }

namespace {
class HostMark final : public TimeMark {
 public:
  HostMark() : at_(std::chrono::steady_clock::now()) {}
  double seconds_since(const TimeMark& earlier) const override {
    const auto* other = dynamic_cast<const HostMark*>(&earlier);
    MICROLLM_CHECK(other != nullptr, ValueError, "TimeMark", "a host mark compares with host marks only");
    return std::chrono::duration<double>(at_ - other->at_).count();
  }

 private:
  std::chrono::steady_clock::time_point at_;
};
}  // namespace

std::unique_ptr<TimeMark> host_time_mark() { return std::make_unique<HostMark>(); }

std::unique_ptr<TimeMark> Communicator::mark() { return host_time_mark(); }

double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  const Tensor t = Tensor::scalar(value, DType::f64, device());
  all_reduce(t, op);
  return t.item<double>();
}

namespace detail {

void check_tensor(const Tensor& t, Device device, const char* op, bool reduction) {
  MICROLLM_CHECK(t.defined(), ValueError, op, "undefined tensor");
  MICROLLM_CHECK(t.is_contiguous(), ValueError, op, "the tensor must be contiguous, got shape ", t.shape(),
                 " with strides ", t.strides());
  MICROLLM_CHECK(t.device() == device, DeviceError, op, "the tensor is on ", t.device(),
                 " but the communicator works on ", device);
  if (reduction) {
    MICROLLM_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f64, DTypeError, op,
                   "reductions take f32, bf16 or f64 tensors, got ", t.dtype());
  }
}

void check_blocks(const Tensor& whole, const Tensor& block, int world_size, const char* op) {
  MICROLLM_CHECK(whole.dtype() == block.dtype(), DTypeError, op, "dtypes differ: ", whole.dtype(), " and ",
                 block.dtype());
  MICROLLM_CHECK(whole.numel() == block.numel() * world_size, ShapeError, op, "the whole tensor has ", whole.numel(),
                 " elements; it must have world_size (", world_size, ") times the block's ", block.numel());
}

}  // namespace detail

void abort_job(const std::string& reason, int exit_code) noexcept {
  int rank = 0, world = 1;
  if (!detail::mpi_rank(rank, world)) {
    try {
      const LaunchInfo launch = detect_launch();
      rank = launch.rank;
      world = launch.world_size;
    } catch (...) {
    }
  }
  std::fprintf(stderr, "[rank %d of %d] %s\n[rank %d of %d] aborting the job\n", rank, world, reason.c_str(), rank,
               world);
  std::fflush(nullptr);
  detail::abort_nccl_communicators();
  detail::abort_mpi(exit_code);
  std::_Exit(exit_code);
}

// ---- the local communicator ----

namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(bool timing) {
    if (timing) {
      started_ = host_time_mark();
      ended_ = host_time_mark();
    }
  }
  void wait() override {}
  bool test() override { return true; }
  const TimeMark* started() const override { return started_.get(); }
  const TimeMark* ended() const override { return ended_.get(); }

 private:
  std::unique_ptr<TimeMark> started_, ended_;  // timing on: both when it was issued (it is done at once)
};

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Device device) : device_(device) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  Device device() const override { return device_; }

  std::unique_ptr<Work> all_reduce_async(const Tensor& tensor, ReduceOp) override {
    detail::check_tensor(tensor, device_, "all_reduce", true);
    return std::make_unique<DoneWork>(timing_);  // the sum and the mean of one tensor are that tensor
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp) override {
    detail::check_tensor(input, device_, "reduce_scatter", true);
    detail::check_tensor(output, device_, "reduce_scatter", true);
    detail::check_blocks(input, output, 1, "reduce_scatter");
    if (input.data_ptr() != output.data_ptr()) Tensor(output).copy_(input.view(output.shape()));
    return std::make_unique<DoneWork>(timing_);
  }
  std::unique_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override {
    detail::check_tensor(input, device_, "all_gather", false);
    detail::check_tensor(output, device_, "all_gather", false);
    detail::check_blocks(output, input, 1, "all_gather");
    if (input.data_ptr() != output.data_ptr()) Tensor(output).copy_(input.view(output.shape()));
    return std::make_unique<DoneWork>(timing_);
  }
  void broadcast(const Tensor& tensor, int root) override {
    detail::check_tensor(tensor, device_, "broadcast", false);
    MICROLLM_CHECK(root == 0, ValueError, "broadcast", "root ", root, " is not a rank of a world of 1");
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& reason, int exit_code) noexcept override {
    abort_job(reason, exit_code);
  }

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(Device device) {
  return std::make_unique<LocalCommunicator>(device);
}

std::unique_ptr<Communicator> create_communicator(const CommunicatorOptions& options) {
  const LaunchInfo launch = detect_launch();
  std::string backend = options.backend;
  if (backend == "auto") {
    if (options.device.is_cuda() && launch.world_size > 1) {
      backend = "nccl";
    } else if (launch.launcher == "mpirun" && launch.world_size > 1) {
      backend = "mpi";
    } else if (launch.world_size > 1) {
      throw ValueError("distributed", str_cat("WORLD_SIZE is ", launch.world_size,
                                              " but CPU training exchanges gradients through MPI: launch it with "
                                              "mpirun -np ",
                                              launch.world_size, " (see docs/DISTRIBUTED.md)"));
    } else {
      backend = "local";
    }
  }
  if (backend == "local") return make_local_communicator(options.device);
  if (backend == "mpi") {
    MICROLLM_CHECK(options.device.is_cpu(), DeviceError, "distributed",
                   "the MPI communicator exchanges host tensors; use nccl for ", options.device);
    return make_mpi_communicator();
  }
  if (backend == "nccl") {
    MICROLLM_CHECK(nccl_built(), NotSupportedError, "distributed",
                   "this build has no NCCL (configure with -DMICROLLM_CUDA=ON)");
    MICROLLM_CHECK(options.device.is_cuda(), DeviceError, "distributed", "NCCL needs a CUDA device, got ",
                   options.device);
    return make_nccl_communicator(launch, options.device, options.timeout_seconds);
  }
  throw ValueError("distributed", str_cat("unknown backend '", backend, "' (have auto, mpi, nccl, local)"));
}

}  // namespace microllm::distributed
