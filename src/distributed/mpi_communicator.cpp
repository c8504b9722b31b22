// The MPI communicator: collectives on host tensors through OpenMPI, non-blocking (MPI_I*) so that a
// gradient bucket's all-reduce runs while backward goes on. Errors return (MPI_ERRORS_RETURN) and become
// BackendError naming the call and the rank; abort() ends the whole job with MPI_Abort.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "distributed/checks.h"
#include "microllm/core/float_formats.h"
#include "microllm/distributed/communicator.h"

namespace microllm::distributed {
namespace {

void check_mpi(int code, const char* call, int rank) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw BackendError("mpi", str_cat(call, " failed on rank ", rank, ": ", std::string(text, length)));
}

#define MICROLLM_MPI_CHECK(call) check_mpi((call), #call, rank_)

// bf16 sums: each step of the reduction adds in f32 and rounds to bf16 once.
void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = bf16_from_float(to_float(a[i]) + to_float(b[i]));
}

// MPI is initialized once per process (on first use) and finalized at exit, unless the job was aborted.
MPI_Op g_bf16_sum = MPI_OP_NULL;

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
    MPI_Finalize();
  }
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Only the thread that drives training calls MPI (OpenMP workers never do).
      const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (code != MPI_SUCCESS) throw BackendError("mpi", "MPI_Init_thread failed");
      std::atexit(finalize_mpi);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Op_create(bf16_sum, 1, &g_bf16_sum);
  });
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return MPI_UINT16_T;  // summed by bf16_sum
    default: throw DTypeError("mpi", str_cat("no MPI reduction for ", dtype));
  }
}

// Divides every element by `divisor` in place (the average after a sum).
void divide(const Tensor& t, int divisor) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] /= divisor;
  } else {
    bf16* p = t.data<bf16>();
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] = bf16_from_float(to_float(p[i]) / d);
  }
}

// Splits a transfer of `count` elements into pieces MPI's int counts can describe.
template <typename F>
void in_chunks(int64_t count, F&& issue) {
  constexpr int64_t kMax = INT_MAX / 2;
  int64_t start = 0;
  do {  // one call even for zero elements: every rank issues the same calls
    issue(start, static_cast<int>(std::min(kMax, count - start)));
    start += kMax;
  } while (start < count);
}

class MpiWork final : public Work {
 public:
  MpiWork(std::vector<MPI_Request> requests, int rank, const char* what, Tensor average, int world,
          std::unique_ptr<TimeMark> started)
      : requests_(std::move(requests)),
        rank_(rank),
        what_(what),
        average_(std::move(average)),
        world_(world),
        started_(std::move(started)) {}
  ~MpiWork() override {
    if (!done_) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), what_, rank_);
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), what_,
              rank_);
    if (flag) {
      done_ = true;
      finish();
    }
    return flag != 0;
  }

  const TimeMark* started() const override { return started_.get(); }
  const TimeMark* ended() const override { return ended_.get(); }

 private:
  void finish() {
    if (started_) ended_ = host_time_mark();  // when this host first saw it complete
    if (average_.defined()) divide(average_, world_);
  }
  std::vector<MPI_Request> requests_;
  int rank_;
  const char* what_;
  Tensor average_;  // divided by world_ once the sum arrived (ReduceOp::avg)
  int world_;
  std::unique_ptr<TimeMark> started_, ended_;  // timing on: when it was issued, when it was seen complete
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    ensure_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MICROLLM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MICROLLM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MICROLLM_MPI_CHECK(MPI_Comm_size(comm_, &world_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

  std::unique_ptr<Work> all_reduce_async(const Tensor& tensor, ReduceOp op) override {
    detail::check_tensor(tensor, Device::cpu(), "all_reduce", true);
    std::vector<MPI_Request> requests;
    char* base = static_cast<char*>(tensor.data_ptr());
    in_chunks(tensor.numel(), [&](int64_t start, int count) {
      requests.emplace_back();
      MICROLLM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, base + start * tensor.element_size(), count,
                                        mpi_type(tensor.dtype()), sum_op(tensor.dtype()), comm_, &requests.back()));
    });
    return make_work(std::move(requests), "MPI_Iallreduce", op == ReduceOp::avg ? tensor : Tensor());
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) override {
    detail::check_tensor(input, Device::cpu(), "reduce_scatter", true);
    detail::check_tensor(output, Device::cpu(), "reduce_scatter", true);
    detail::check_blocks(input, output, world_, "reduce_scatter");
    MICROLLM_CHECK(output.numel() <= INT_MAX, ValueError, "reduce_scatter", "blocks of ", output.numel(),
                   " elements are too large for one MPI call");
    std::vector<MPI_Request> requests(1);
    MICROLLM_MPI_CHECK(MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(),
                                                 static_cast<int>(output.numel()), mpi_type(input.dtype()),
                                                 sum_op(input.dtype()), comm_, requests.data()));
    return make_work(std::move(requests), "MPI_Ireduce_scatter_block", op == ReduceOp::avg ? output : Tensor());
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) override {
    detail::check_tensor(input, Device::cpu(), "all_gather", false);
    detail::check_tensor(output, Device::cpu(), "all_gather", false);
    detail::check_blocks(output, input, world_, "all_gather");
    MICROLLM_CHECK(input.nbytes() <= INT_MAX, ValueError, "all_gather", "blocks of ", input.nbytes(),
                   " bytes are too large for one MPI call");
    const bool in_place =
        static_cast<char*>(output.data_ptr()) + static_cast<size_t>(rank_) * input.nbytes() == input.data_ptr();
    std::vector<MPI_Request> requests(1);
    const int bytes = static_cast<int>(input.nbytes());
    MICROLLM_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : input.data_ptr(), bytes, MPI_BYTE, output.data_ptr(),
                                      bytes, MPI_BYTE, comm_, requests.data()));
    return make_work(std::move(requests), "MPI_Iallgather", Tensor());
  }

  void broadcast(const Tensor& tensor, int root) override {
    detail::check_tensor(tensor, Device::cpu(), "broadcast", false);
    MICROLLM_CHECK(root >= 0 && root < world_, ValueError, "broadcast", "root ", root, " is not a rank of ", world_);
    char* base = static_cast<char*>(tensor.data_ptr());
    in_chunks(static_cast<int64_t>(tensor.nbytes()), [&](int64_t start, int count) {
      MICROLLM_MPI_CHECK(MPI_Bcast(base + start, count, MPI_BYTE, root, comm_));
    });
  }

  void barrier() override { MICROLLM_MPI_CHECK(MPI_Barrier(comm_)); }

  [[noreturn]] void abort(const std::string& reason, int exit_code) noexcept override {
    abort_job(reason, exit_code);
  }

 private:
  MPI_Op sum_op(DType dtype) const { return dtype == DType::bf16 ? g_bf16_sum : MPI_SUM; }
  std::unique_ptr<Work> make_work(std::vector<MPI_Request> requests, const char* what, Tensor average) {
    return std::make_unique<MpiWork>(std::move(requests), rank_, what, std::move(average), world_,
                                     timing_ ? host_time_mark() : nullptr);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
};

}  // namespace

namespace detail {

bool mpi_rank(int& rank, int& world) noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return true;
}

void abort_mpi(int exit_code) noexcept {
  int rank = 0, world = 1;
  if (mpi_rank(rank, world)) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace detail

bool mpi_built() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace microllm::distributed
