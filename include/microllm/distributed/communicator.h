// Collectives between the processes of one training job: one process per device, all running the same
// program. Two real engines sit behind one interface: MPI (OpenMPI) for tensors in host memory, NCCL for
// tensors on CUDA devices; a local communicator (world size 1) stands in when there is no job.
//
//   auto comm = distributed::create_communicator({.device = Device::cuda(local_rank)});
//   comm->all_reduce(grads, distributed::ReduceOp::avg);              // every rank gets the mean
//   auto work = comm->all_reduce_async(bucket);  ...  work->wait();   // overlaps with other work
//
// Every rank must issue the same collectives in the same order with the same sizes. Tensors are contiguous
// and live on comm->device(); reductions take f32 or bf16 (bf16 sums in f32 and rounds once per step of the
// reduction), broadcast takes any dtype. Results are written in place.
//
// Failures: a failed call throws BackendError naming the call and the rank. A collective whose peer died or
// threw does not hang forever: MPI jobs end when one process calls abort() or exits (mpirun then stops the
// others); NCCL waits poll the communicator's asynchronous error and give up after options.timeout_seconds.
#pragma once

#include <memory>
#include <string>

#include "microllm/core/tensor.h"

namespace microllm::distributed {

enum class ReduceOp { sum, avg };
const char* reduce_op_name(ReduceOp op);

// A point on this rank's timeline, for profiling (Communicator::set_timing): an event recorded on a CUDA
// stream (NCCL), or the host clock (MPI, local).
class TimeMark {
 public:
  virtual ~TimeMark() = default;
  // Seconds from `earlier` (a mark of the same communicator) to this one; negative when this came first.
  // On a GPU it waits until both events happened.
  virtual double seconds_since(const TimeMark& earlier) const = 0;
};

// A collective in flight, from an *_async call. wait() returns when the result may be used: on the CPU,
// when it is in memory; with NCCL, when work queued afterwards on the current stream sees it (the host does
// not wait for the GPU, but it does watch for errors and the timeout while the collective runs). The tensors
// a Work refers to must stay alive until wait() returned. Destroying an unwaited Work waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // True once the collective is done (never blocks; on MPI it also lets the collective progress).
  virtual bool test() = 0;
  // With timing on (Communicator::set_timing) when the work was issued: when the collective started and
  // when it ended, valid once wait() returned (NCCL: events on the communication stream around the call;
  // MPI: the host clock when it was issued and when the host first saw it complete, in test() or wait()).
  // Null otherwise.
  virtual const TimeMark* started() const { return nullptr; }
  virtual const TimeMark* ended() const { return nullptr; }
};

// How this process was launched, from the environment (rendezvous.cpp):
//   mpirun:        OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   torchrun/Slurm: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (Slurm: SLURM_PROCID,
//                  SLURM_NTASKS, SLURM_LOCALID when RANK is unset)
//   none:          rank 0 of 1
struct LaunchInfo {
  std::string launcher = "none";  // "mpirun", "env" or "none"
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};
LaunchInfo detect_launch();

struct CommunicatorOptions {
  // auto: nccl for a CUDA device, mpi when launched by mpirun, local for a single process.
  std::string backend = "auto";  // auto | mpi | nccl | local
  Device device = Device::cpu();  // where the tensors live (NCCL: this process's GPU)
  double timeout_seconds = 300;   // NCCL collectives and the TCP rendezvous give up (an error) after this
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", "local"
  virtual Device device() const = 0;
  bool is_main() const { return rank() == 0; }

  // tensor <- op over every rank's tensor (in place).
  virtual std::unique_ptr<Work> all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // input has world_size * n elements, output n: output <- op over every rank's block `rank()` of input.
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, const Tensor& output,
                                                     ReduceOp op = ReduceOp::sum) = 0;
  // input has n elements, output world_size * n: block r of output <- rank r's input. input may be block
  // rank() of output (in place).
  virtual std::unique_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output) = 0;
  // tensor <- root's tensor (any dtype).
  virtual void broadcast(const Tensor& tensor, int root = 0) = 0;
  virtual void barrier() = 0;
  // Ends the whole job: prints "[rank r] reason" to stderr, then MPI_Abort (every process of the mpirun
  // job ends) or ncclCommAbort + exit (the launcher, or the peers' timeouts, end the others). Never returns.
  [[noreturn]] virtual void abort(const std::string& reason, int exit_code = 1) noexcept = 0;

  // Profiling, off by default (then collectives record nothing): with timing on, every collective issued
  // records when it started and ended (Work::started / ended), and mark() records "now" on the caller's
  // current stream (NCCL) or the host clock.
  void set_timing(bool on) { timing_ = on; }
  bool timing() const { return timing_; }
  virtual std::unique_ptr<TimeMark> mark();

  // Blocking forms.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) { all_reduce_async(tensor, op)->wait(); }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void all_gather(const Tensor& input, const Tensor& output) { all_gather_async(input, output)->wait(); }
  // A host value all-reduced (f64 on the wire: exact for flags and counts), for control decisions that every
  // rank must take alike (stop now?).
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::sum);

 protected:
  bool timing_ = false;
};

// The host clock as a TimeMark (the CPU communicators' marks).
std::unique_ptr<TimeMark> host_time_mark();

// The communicator for this process (see CommunicatorOptions::backend). With "auto" and no job around
// (detect_launch().world_size == 1) it is a local one; asking for a backend this build lacks is a
// NotSupportedError.
std::unique_ptr<Communicator> create_communicator(const CommunicatorOptions& options = {});

// A world of one (rank 0 of 1): collectives copy or do nothing. For single-process runs and tests.
std::unique_ptr<Communicator> make_local_communicator(Device device = Device::cpu());
// MPI_COMM_WORLD, duplicated (MPI is initialized on first use, finalized at exit).
std::unique_ptr<Communicator> make_mpi_communicator();
// NCCL over the ranks of `launch` on `device`; the unique id travels from rank 0 through MPI when launched by
// mpirun, else through the TCP rendezvous at MASTER_ADDR:MASTER_PORT.
std::unique_ptr<Communicator> make_nccl_communicator(const LaunchInfo& launch, Device device, double timeout_seconds);

// Ends this job from any rank after printing "[rank r] reason" to stderr: MPI_Abort when MPI is running (mpirun
// stops every process), else every live NCCL communicator is aborted and the process exits with exit_code
// (the launcher, or the peers' timeouts, end the others). For errors on one rank: returning from main
// instead would leave the other ranks waiting in their next collective.
[[noreturn]] void abort_job(const std::string& reason, int exit_code = 1) noexcept;

bool mpi_built();   // always true in this build (MPI is a dependency of the distributed layer)
bool nccl_built();  // true in CUDA builds

// The TCP rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT and sends `bytes` (rank 0's) to every other
// rank, which connects (retrying until the timeout) and receives them. Used only for the NCCL unique id.
std::string tcp_broadcast(const std::string& bytes, const LaunchInfo& launch, double timeout_seconds);

}  // namespace microllm::distributed
