// Data-parallel training: every rank holds the whole model, computes gradients on its share of the global
// batch, and the gradients are averaged over the ranks before the (identical) optimizer step.
//
//   distributed::DataParallel ddp(model.named_parameters(), comm, {.zero1 = false});
//   train::Optimizer opt(ddp.optimizer_parameters(), ...);
//   for (micro = 0; micro < accum; ++micro) {
//     ddp.set_sync(micro + 1 == accum);    // communicate only after the last micro-batch
//     loss.backward();                     // buckets start their all-reduce as their gradients arrive
//   }
//   ddp.finish_gradients();                // waits; every grad is now the average over the ranks
//   opt.step(lr, clip_coefficient(ddp.gradient_norm(), 1.0));
//   ddp.after_step();                      // ZeRO-1: all-gathers the updated parameters
//   opt.zero_grad(); ddp.zero_grad();
//
// Buckets: the parameters, in reverse order (the order backward produces their gradients), are grouped
// into buckets of about bucket_mb megabytes. A post-accumulate hook on each parameter (autograd/variable.h)
// copies its gradient into its bucket once backward has no more to add to it; when a bucket is complete
// its all-reduce starts (asynchronously: NCCL on a communication stream, MPI non-blocking), in bucket order
// on every rank, while backward computes the earlier layers' gradients. The sum is divided by the world
// size once, when it arrives. Afterwards each parameter's grad is a view of its bucket.
//
// ZeRO-1 (options.zero1): the optimizer state is sharded. Each bucket is padded to a multiple of the world
// size and rank r owns block r of it: buckets are reduce-scattered instead of all-reduced, the optimizer
// updates only the owned slices (optimizer_parameters() lists them: views of the parameters), and
// after_step() all-gathers the parameters (stored in one flat buffer per bucket for that). Moments take
// 1 / world_size of the memory; checkpoints hold the full state (gather_optimizer_state).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "microllm/distributed/communicator.h"
#include "microllm/nn/module.h"

namespace microllm::distributed {

struct DataParallelOptions {
  double bucket_mb = 25;  // bucket capacity in MB (1e6 bytes) of gradients
  bool zero1 = false;     // shard the optimizer state (reduce-scatter, update the shard, all-gather)
  bool broadcast_parameters = true;  // start from rank 0's parameters
  // Profiling: time each gradient bucket's collective against the end of backward (see CollectiveTiming).
  // Off, nothing is recorded and nothing waits; on, finish_gradients() reads the marks (on a GPU: waits
  // for events that are, but for the end-of-backward one, already complete).
  bool time_collectives = false;
};

// The gradient collectives of the steps since the last take_timing(), measured on this rank against the
// end of backward (the moment finish_gradients() is called: an event on the compute stream, or the host
// clock on the CPU). With NCCL, a collective runs from the event recorded on the communication stream
// before the call (it completes when the stream reaches the call) to the one after it; with MPI, from
// the host issuing it to the host first seeing it complete (tested by each later gradient hook, so its
// end is late by up to one hook's interval).
struct CollectiveTiming {
  int64_t steps = 0;
  int64_t collectives = 0;
  double seconds = 0;          // time during which at least one of them ran (the union of their spans)
  double hidden_seconds = 0;   // the part of it before backward ended
  double exposed_seconds = 0;  // from the end of backward to the end of the step's last collective
  double hidden_share() const { return seconds > 0 ? hidden_seconds / seconds : 0; }
};

struct DataParallelStats {
  int buckets = 0;
  size_t bucket_bytes = 0;             // gradient buckets (plus the ZeRO-1 shard buffers)
  int64_t parameters = 0;              // elements of the model's parameters
  int64_t optimizer_parameters = 0;    // elements this rank's optimizer updates (all, or the ZeRO-1 shard)
  int64_t collectives = 0;             // launched so far
};

class DataParallel {
 public:
  // params: the model's parameters (f32 or bf16, one device, the communicator's); stable Variable pointers.
  DataParallel(std::vector<nn::ParameterInfo> params, Communicator& comm, DataParallelOptions options = {});
  ~DataParallel();  // removes the hooks (waits for collectives in flight)
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Whether the next backward() communicates (default true). Off: gradients accumulate locally, as in
  // a single process; the backward after set_sync(true) sends the accumulated sum.
  void set_sync(bool sync);
  bool sync() const { return sync_; }

  // After the last backward of a step (with sync on): sends the buckets still unsent (gradients of
  // parameters that backward did not reach count as zero), waits for every bucket, and sets the averaged
  // gradients: on each model parameter (plain) or on each optimizer_parameters() slice (ZeRO-1).
  void finish_gradients();
  // The global L2 norm of the averaged gradients (f32 rank 0 on the device), the same on every rank.
  Tensor gradient_norm();
  // Plain: the model's parameters. ZeRO-1: this rank's slices of them (1-D views, named as the parameter
  // they belong to); build the optimizer over these.
  const std::vector<nn::ParameterInfo>& optimizer_parameters() const;
  // After the optimizer step: ZeRO-1 all-gathers the updated parameters; plain DDP has nothing to do.
  void after_step();
  // Drops the gradients of the model's parameters and of the ZeRO-1 slices.
  void zero_grad();

  // ZeRO-1 checkpoints (collective: every rank calls it). From Optimizer::state() over
  // optimizer_parameters() ("<slot>.<name>" per slice, "step"), the full state a single process would
  // have ("<slot>.<name>" of each parameter's shape, "step"). Plain DDP returns `state` as it is.
  std::vector<std::pair<std::string, Tensor>> gather_optimizer_state(
      const std::vector<std::pair<std::string, Tensor>>& state);
  // The inverse, for Optimizer::load_state: from a getter of full tensors (a checkpoint of any world size),
  // a getter of this rank's slices.
  std::function<Tensor(const std::string&)> shard_state_getter(std::function<Tensor(const std::string&)> get) const;

  Communicator& communicator() { return *comm_; }
  const DataParallelOptions& options() const { return options_; }
  DataParallelStats stats() const;
  // With options.time_collectives: the timing gathered since the last call (then reset).
  CollectiveTiming take_timing();

 private:
  struct Bucket;
  void on_gradient(size_t index);
  void stage(size_t index);    // copies parameter index's gradient (or zeros) into its bucket
  void launch_ready();         // starts the complete buckets, in order
  void progress();             // lets MPI move the collectives in flight

  std::vector<nn::ParameterInfo> params_;
  Communicator* comm_;
  DataParallelOptions options_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;   // parameter index -> bucket
  std::vector<int64_t> offset_of_;  // parameter index -> element offset in its bucket
  std::vector<bool> staged_;        // parameter index -> its gradient is in the bucket this step
  size_t next_launch_ = 0;
  bool sync_ = true;
  int64_t collectives_ = 0;
  CollectiveTiming timing_;
  // ZeRO-1: this rank's slices, as variables the optimizer updates (values are views of the parameters).
  std::vector<std::unique_ptr<autograd::Variable>> slice_variables_;
  std::vector<nn::ParameterInfo> slices_;
  struct Slice {
    size_t param, bucket;
    int64_t begin, length;  // element range within the parameter
    int64_t shard_offset;   // its offset in the bucket's shard
  };
  std::vector<Slice> slice_info_;
};

}  // namespace microllm::distributed
