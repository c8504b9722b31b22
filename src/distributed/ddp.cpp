// Data-parallel gradients: buckets filled by post-accumulate hooks, sent while backward runs, averaged
// once; ZeRO-1 sharding of the optimizer's parameters (see distributed/ddp.h).
#include "microllm/distributed/ddp.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "microllm/ops/elementwise.h"
#include "microllm/ops/optim.h"
#include "microllm/ops/reduce.h"

namespace microllm::distributed {

struct DataParallel::Bucket {
  std::vector<size_t> params;  // parameter indices, in the order they sit in the bucket
  int64_t numel = 0;           // elements of the parameters
  int64_t padded = 0;          // numel rounded up to a multiple of the world size (ZeRO-1), else numel
  int64_t shard = 0;           // padded / world size (ZeRO-1)
  Tensor grads;                // [padded]: the staged, then averaged gradients
  Tensor shard_grads;          // ZeRO-1 [shard]: this rank's block of the averaged gradients
  Tensor flat_params;          // ZeRO-1 [padded]: the parameters' storage
  size_t staged = 0;           // parameters staged this step
  bool launched = false;
  std::unique_ptr<Work> work;
};

DataParallel::DataParallel(std::vector<nn::ParameterInfo> params, Communicator& comm, DataParallelOptions options)
    : params_(std::move(params)), comm_(&comm), options_(options) {
  const char* where = "ddp";
  MICROLLM_CHECK(!params_.empty(), ValueError, where, "no parameters");
  MICROLLM_CHECK(options_.bucket_mb > 0, ValueError, where, "bucket_mb must be > 0, got ", options_.bucket_mb);
  const DType dtype = params_.front().variable->dtype();
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16, DTypeError, where,
                 "parameters must be f32 or bf16, got ", dtype);
  for (const nn::ParameterInfo& p : params_) {
    MICROLLM_CHECK(p.variable->dtype() == dtype, DTypeError, where, p.name, " is ", p.variable->dtype(), " but ",
                   params_.front().name, " is ", dtype, ": one dtype for every parameter");
    MICROLLM_CHECK(p.variable->device() == comm.device(), DeviceError, where, p.name, " is on ",
                   p.variable->device(), " but the communicator works on ", comm.device());
    MICROLLM_CHECK(p.variable->is_leaf(), ValueError, where, p.name, " is not a leaf variable");
  }
  const int world = comm.world_size(), rank = comm.rank();
  const Device device = comm.device();
  const auto capacity = static_cast<double>(options_.bucket_mb) * 1e6;
  const size_t element = dtype_size(dtype);

  // Buckets in reverse parameter order: backward produces the last layers' gradients first.
  bucket_of_.resize(params_.size());
  offset_of_.resize(params_.size());
  staged_.assign(params_.size(), false);
  for (size_t k = params_.size(); k-- > 0;) {
    if (buckets_.empty() || static_cast<double>(buckets_.back()->numel * static_cast<int64_t>(element)) >= capacity)
      buckets_.push_back(std::make_unique<Bucket>());
    Bucket& b = *buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    offset_of_[k] = b.numel;
    b.params.push_back(k);
    b.numel += params_[k].variable->value().numel();
  }
  for (std::unique_ptr<Bucket>& bp : buckets_) {
    Bucket& b = *bp;
    b.padded = options_.zero1 ? (b.numel + world - 1) / world * world : b.numel;
    b.shard = b.padded / world;
    b.grads = Tensor::zeros({b.padded}, dtype, device);
    if (!options_.zero1) continue;
    b.shard_grads = Tensor::zeros({b.shard}, dtype, device);
    // The parameters move into one flat buffer per bucket (each becomes a view of it), so that the
    // all-gather after the step writes them in place.
    b.flat_params = Tensor::zeros({b.padded}, dtype, device);
    for (size_t k : b.params) {
      autograd::Variable& v = *params_[k].variable;
      Tensor view = b.flat_params.narrow(0, offset_of_[k], v.value().numel()).view(v.shape());
      view.copy_(v.value());
      v.set_value(view);
    }
  }
  if (options_.broadcast_parameters && world > 1) {
    if (options_.zero1) {
      for (std::unique_ptr<Bucket>& b : buckets_) comm.broadcast(b->flat_params, 0);
    } else {
      for (const nn::ParameterInfo& p : params_) {
        Tensor value = p.variable->value();
        if (value.is_contiguous()) {
          comm.broadcast(value, 0);
        } else {
          const Tensor copy = value.contiguous();
          comm.broadcast(copy, 0);
          value.copy_(copy);
        }
      }
    }
  }
  if (options_.zero1) {
    // This rank's block [rank * shard, (rank + 1) * shard) of each bucket, cut at parameter boundaries.
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      const Bucket& b = *buckets_[bi];
      const int64_t lo = rank * b.shard, hi = lo + b.shard;
      for (size_t k : b.params) {
        const int64_t start = offset_of_[k], end = start + params_[k].variable->value().numel();
        const int64_t a = std::max(lo, start), e = std::min(hi, end);
        if (a >= e) continue;
        slice_info_.push_back({k, bi, a - start, e - a, a - lo});
        slice_variables_.push_back(
            std::make_unique<autograd::Variable>(b.flat_params.narrow(0, a, e - a), false));
        slices_.push_back({params_[k].name, slice_variables_.back().get(), params_[k].weight_decay});
      }
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].variable->set_post_accumulate_hook([this, k](const autograd::Variable&) { on_gradient(k); });
  }
}

DataParallel::~DataParallel() {
  for (const nn::ParameterInfo& p : params_) p.variable->set_post_accumulate_hook({});
  for (std::unique_ptr<Bucket>& b : buckets_) b->work.reset();  // waits for a collective in flight
}

void DataParallel::set_sync(bool sync) { sync_ = sync; }

void DataParallel::on_gradient(size_t index) {
  if (!sync_) return;  // a micro-step: the gradient stays in the parameter and accumulates
  MICROLLM_CHECK(!staged_[index], ValueError, "ddp", params_[index].name,
                 " received a gradient after its bucket was staged in this step: call set_sync(false) before every "
                 "backward of a step but the last, and finish_gradients() after it");
  stage(index);
  launch_ready();
  progress();
}

void DataParallel::stage(size_t index) {
  Bucket& b = *buckets_[bucket_of_[index]];
  autograd::Variable& v = *params_[index].variable;
  Tensor slot = b.grads.narrow(0, offset_of_[index], v.value().numel()).view(v.shape());
  if (v.grad().defined()) {
    slot.copy_(v.grad());
  } else {  // backward did not reach it on this rank: it adds nothing to the sum
    slot.copy_(Tensor::zeros(v.shape(), slot.dtype(), slot.device()));
  }
  v.zero_grad();  // the bucket holds it now; finish_gradients() puts the average back
  staged_[index] = true;
  ++b.staged;
}

void DataParallel::launch_ready() {
  // In bucket order on every rank: collectives must be issued in the same order everywhere.
  const bool timing = comm_->timing();
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->staged == buckets_[next_launch_]->params.size()) {
    Bucket& b = *buckets_[next_launch_++];
    comm_->set_timing(timing || options_.time_collectives);  // only the bucket collectives are timed
    b.work = options_.zero1 ? comm_->reduce_scatter_async(b.grads, b.shard_grads, ReduceOp::avg)
                            : comm_->all_reduce_async(b.grads, ReduceOp::avg);
    comm_->set_timing(timing);
    b.launched = true;
    ++collectives_;
  }
}

void DataParallel::progress() {
  for (size_t i = 0; i < next_launch_; ++i) {
    if (buckets_[i]->work) buckets_[i]->work->test();
  }
}

void DataParallel::finish_gradients() {
  MICROLLM_CHECK(sync_, ValueError, "ddp", "finish_gradients() after a backward with set_sync(false)");
  const std::unique_ptr<TimeMark> backward_end = options_.time_collectives ? comm_->mark() : nullptr;
  std::vector<std::pair<double, double>> spans;  // timing: each collective's [start, end], s after backward_end
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!staged_[k]) stage(k);
  }
  launch_ready();
  for (std::unique_ptr<Bucket>& bp : buckets_) {
    Bucket& b = *bp;
    b.work->wait();
    if (backward_end && b.work->started() != nullptr && b.work->ended() != nullptr) {
      spans.emplace_back(b.work->started()->seconds_since(*backward_end),
                         b.work->ended()->seconds_since(*backward_end));
    }
    b.work.reset();
    b.launched = false;
    b.staged = 0;
    if (!options_.zero1) {
      for (size_t k : b.params) {
        autograd::Variable& v = *params_[k].variable;
        v.set_grad(b.grads.narrow(0, offset_of_[k], v.value().numel()).view(v.shape()));
      }
    }
  }
  for (size_t s = 0; s < slice_info_.size(); ++s) {
    const Slice& info = slice_info_[s];
    slice_variables_[s]->set_grad(buckets_[info.bucket]->shard_grads.narrow(0, info.shard_offset, info.length));
  }
  if (backward_end) {
    // The union of the spans (NCCL runs them one after another on its stream; MPI's are in flight together),
    // split at the end of backward.
    std::sort(spans.begin(), spans.end());
    double covered_to = -INFINITY;
    for (const auto& [start, end] : spans) {
      const double from = std::max(start, covered_to);
      if (end > from) {
        timing_.seconds += end - from;
        timing_.hidden_seconds += std::max(0.0, std::min(end, 0.0) - from);
        covered_to = end;
      }
    }
    timing_.exposed_seconds += std::max(0.0, covered_to);
    timing_.collectives += static_cast<int64_t>(spans.size());
    ++timing_.steps;
  }
  staged_.assign(params_.size(), false);
  next_launch_ = 0;
}

CollectiveTiming DataParallel::take_timing() { return std::exchange(timing_, CollectiveTiming{}); }

Tensor DataParallel::gradient_norm() {
  if (!options_.zero1) {
    std::vector<Tensor> grads;
    for (const nn::ParameterInfo& p : params_) {
      if (p.variable->grad().defined()) grads.push_back(p.variable->grad());
    }
    MICROLLM_CHECK(!grads.empty(), ValueError, "ddp", "gradient_norm: no gradients (call finish_gradients first)");
    return global_norm(grads);  // the averaged gradients are the same on every rank
  }
  std::vector<Tensor> shards;
  for (const std::unique_ptr<Bucket>& b : buckets_) shards.push_back(b->shard_grads);
  Tensor squares = sum(sum_squares(shards));  // this rank's blocks (padding is zero)
  comm_->all_reduce(squares, ReduceOp::sum);
  return sqrt(squares);
}

const std::vector<nn::ParameterInfo>& DataParallel::optimizer_parameters() const {
  return options_.zero1 ? slices_ : params_;
}

void DataParallel::after_step() {
  if (!options_.zero1) return;
  const int rank = comm_->rank();
  for (std::unique_ptr<Bucket>& b : buckets_) {
    b->work = comm_->all_gather_async(b->flat_params.narrow(0, rank * b->shard, b->shard), b->flat_params);
    ++collectives_;
  }
  for (std::unique_ptr<Bucket>& b : buckets_) {
    b->work->wait();
    b->work.reset();
  }
}

void DataParallel::zero_grad() {
  for (const nn::ParameterInfo& p : params_) p.variable->zero_grad();
  for (const nn::ParameterInfo& p : slices_) p.variable->zero_grad();
}

std::vector<std::pair<std::string, Tensor>> DataParallel::gather_optimizer_state(
    const std::vector<std::pair<std::string, Tensor>>& state) {
  if (!options_.zero1) return state;
  std::map<std::string, Tensor> by_name;
  std::set<std::string> slots;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, tensor] : state) {
    const size_t dot = name.find('.');
    if (dot == std::string::npos) {
      out.emplace_back(name, tensor);  // "step"
      continue;
    }
    slots.insert(name.substr(0, dot));
    by_name[name] = tensor;
  }
  const auto count = static_cast<double>(slots.size());
  MICROLLM_CHECK(comm_->all_reduce_scalar(count) == count * comm_->world_size(), ValueError, "ddp",
                 "gather_optimizer_state: the ranks' optimizers have different state slots");
  const int rank = comm_->rank();
  for (const std::string& slot : slots) {
    Tensor like;
    for (const auto& [name, tensor] : by_name) {
      if (name.starts_with(slot + ".")) like = tensor;
    }
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      const Bucket& b = *buckets_[bi];
      Tensor full = Tensor::zeros({b.padded}, like.dtype(), like.device());
      Tensor own = full.narrow(0, rank * b.shard, b.shard);
      for (const Slice& s : slice_info_) {
        if (s.bucket != bi) continue;
        const std::string name = slot + "." + params_[s.param].name;
        auto it = by_name.find(name);
        MICROLLM_CHECK(it != by_name.end(), ValueError, "ddp", "gather_optimizer_state: no state ", name);
        own.narrow(0, s.shard_offset, s.length).copy_(it->second.reshape({-1}));
      }
      comm_->all_gather(own, full);
      for (size_t k : b.params) {
        const autograd::Variable& v = *params_[k].variable;
        out.emplace_back(slot + "." + params_[k].name,
                         full.narrow(0, offset_of_[k], v.value().numel()).view(v.shape()));
      }
    }
  }
  return out;
}

std::function<Tensor(const std::string&)> DataParallel::shard_state_getter(
    std::function<Tensor(const std::string&)> get) const {
  if (!options_.zero1) return get;
  std::unordered_map<std::string, size_t> slice_of;
  for (size_t s = 0; s < slice_info_.size(); ++s) slice_of[params_[slice_info_[s].param].name] = s;
  return [this, get = std::move(get), slice_of = std::move(slice_of)](const std::string& name) -> Tensor {
    const size_t dot = name.find('.');
    if (dot == std::string::npos) return get(name);
    auto it = slice_of.find(name.substr(dot + 1));
    MICROLLM_CHECK(it != slice_of.end(), ValueError, "ddp", "no parameter slice for state ", name);
    const Slice& s = slice_info_[it->second];
    const Tensor full = get(name);
    const autograd::Variable& v = *params_[s.param].variable;
    MICROLLM_CHECK(full.numel() == v.value().numel(), ShapeError, "ddp", name, " has shape ", full.shape(),
                   " but the parameter has shape ", v.shape());
    return full.reshape({-1}).narrow(0, s.begin, s.length);
  };
}

DataParallelStats DataParallel::stats() const {
  DataParallelStats s;
  s.buckets = static_cast<int>(buckets_.size());
  for (const std::unique_ptr<Bucket>& b : buckets_) {
    s.bucket_bytes += b->grads.nbytes() + (b->shard_grads.defined() ? b->shard_grads.nbytes() : 0);
  }
  for (const nn::ParameterInfo& p : params_) s.parameters += p.variable->value().numel();
  for (const nn::ParameterInfo& p : optimizer_parameters()) s.optimizer_parameters += p.variable->value().numel();
  s.collectives = collectives_;
  return s;
}

}  // namespace microllm::distributed
