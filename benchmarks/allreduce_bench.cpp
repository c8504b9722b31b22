// A sanity baseline for data-parallel training on GPUs: the time to all-reduce (average) the gradient of a
// Qwen2.5-0.5B-sized model (494,032,768 parameters) through NCCL, in 25 MB buckets as DDP sends them and as
// one call, in bf16 and f32. With one GPU (world size 1) NCCL still copies every bucket through its kernels:
// the number is the floor on which more GPUs add their link time.
//   build/cuda-release/benchmarks/allreduce_bench [--params N] [--bucket-mb MB] [--iters N]
//   mpirun -np 8 build/cuda-release/benchmarks/allreduce_bench     (one GPU per rank; or torchrun's env)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "microllm/core/cuda.h"
#include "microllm/distributed/communicator.h"

namespace microllm {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median seconds of `iters` runs of fn (after 2 warm-up runs), each ending with the device synchronized.
template <typename F>
double median_seconds(int iters, int device, F&& fn) {
  for (int i = 0; i < 2; ++i) fn();
  cuda::synchronize(device);
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const double start = now();
    fn();
    cuda::synchronize(device);
    times.push_back(now() - start);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int run(int argc, char** argv) {
  int64_t params = 494'032'768;  // Qwen2.5-0.5B (tied embeddings)
  double bucket_mb = 25;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--params" && has_value) {
      params = std::atoll(argv[++i]);
    } else if (arg == "--bucket-mb" && has_value) {
      bucket_mb = std::atof(argv[++i]);
    } else if (arg == "--iters" && has_value) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--params N] [--bucket-mb MB] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "allreduce_bench: no CUDA device on this machine\n");
    return 1;
  }
  const distributed::LaunchInfo launch = distributed::detect_launch();
  const Device device = Device::cuda(launch.local_rank);
  std::unique_ptr<distributed::Communicator> comm =
      distributed::create_communicator({.backend = "nccl", .device = device});
  const bool is_main = comm->rank() == 0;
  if (is_main) {
    std::string command;
    for (int i = 0; i < argc; ++i) {
      if (i > 0) command += ' ';
      command += argv[i];
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const cuda::DeviceProperties props = cuda::device_properties(device.index);
    std::printf("command: %s\nmachine: %s, %s (%.0f GiB), world size %d (%s)\n", command.c_str(), host,
                props.name.c_str(), static_cast<double>(props.total_memory) / (1 << 30), comm->world_size(),
                launch.launcher.c_str());
    std::printf("all-reduce (avg) of %lld gradients, median of %d runs\n\n", static_cast<long long>(params), iters);
    std::printf("| dtype | how | buckets | MB | ms | GB/s (algbw) |\n|---|---|---|---|---|---|\n");
  }
  for (const DType dtype : {DType::bf16, DType::f32}) {
    const Tensor grads = Tensor::zeros({params}, dtype, device);
    const auto bucket_elements =
        std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / static_cast<double>(dtype_size(dtype))));
    std::vector<Tensor> buckets;
    for (int64_t start = 0; start < params; start += bucket_elements)
      buckets.push_back(grads.narrow(0, start, std::min(bucket_elements, params - start)));
    const double bytes = static_cast<double>(grads.nbytes());
    auto row = [&](const char* how, size_t count, double seconds) {
      if (is_main)
        std::printf("| %s | %s | %zu | %.0f | %.2f | %.1f |\n", dtype_name(dtype), how, count, bytes / 1e6,
                    seconds * 1e3, bytes / seconds / 1e9);
    };
    const double bucketed = median_seconds(iters, device.index, [&] {
      std::vector<std::unique_ptr<distributed::Work>> works;
      for (const Tensor& b : buckets) works.push_back(comm->all_reduce_async(b, distributed::ReduceOp::avg));
      for (auto& w : works) w->wait();
    });
    row(str_cat("buckets of ", bucket_mb, " MB").c_str(), buckets.size(), bucketed);
    const double whole =
        median_seconds(iters, device.index, [&] { comm->all_reduce(grads, distributed::ReduceOp::avg); });
    row("one call", 1, whole);
  }
  return 0;
}

}  // namespace
}  // namespace microllm

int main(int argc, char** argv) {
  try {
    return microllm::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
