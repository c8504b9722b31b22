// CUDA sampling: the rule of ../sampling_math.h on the device, in three launches per call and no host wait.
//   1. prepare (a block per row): the penalized logits and their first maximum; a greedy row ends here (id,
//      counts, offset). A sampled row writes the keys (sampling::rank_key) of its candidates that weigh
//      anything to its segment of a [B, V] u64 workspace, in any order (keys are unique), and the segment's end.
//   2. cub::DeviceSegmentedRadixSort sorts every segment (a greedy row's is empty). In a real model's logits at
//      T <= 1 few tokens weigh anything (those within ~21 nats of the maximum), so segments are short.
//   3. choose (a block per sampled row): block-wide sums and scans of the exact integer weights over the sorted
//      keys: the top-k total, the min-p cut, the top-p cut, then the draw. The integers are the ones the CPU
//      loop adds, so the id is the CPU's; then id, counts and offset are written.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "../sampling_math.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

using namespace sampling;

constexpr int kBlock = 1024;
constexpr uint64_t kNone = UINT64_MAX;

// Where the rows live: element strides of every tensor (narrowed or selected views work as they are).
struct Rows {
  const void* logits;
  int64_t logits_row, logits_col;
  const float* params;
  int64_t params_row, params_col;
  int64_t* rng;  // [b * rng_row] seed, [b * rng_row + rng_col] offset
  int64_t rng_row, rng_col;
  int32_t* counts;  // nullptr: no counts
  int64_t counts_row, counts_col;
  int32_t* out;
  int64_t out_stride;
  int64_t vocab;
};

__device__ __forceinline__ RowParams params_of(const Rows& rows, int64_t b) {
  return row_params(rows.params + b * rows.params_row, rows.params_col);
}

// The id of row b is chosen: write it and advance the row's state (one thread).
__device__ void finish_row(const Rows& rows, int64_t b, int32_t id) {
  rows.out[b * rows.out_stride] = id;
  rows.rng[b * rows.rng_row + rows.rng_col] += 1;
  if (rows.counts != nullptr) rows.counts[b * rows.counts_row + id * rows.counts_col] += 1;
}

__device__ __forceinline__ uint64_t warp_min(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = min(v, static_cast<uint64_t>(MICROLLM_SHFL_XOR(v, offset)));
  return v;
}

// Minimum over the block; every thread gets it. `scratch` holds 32 values of shared memory.
__device__ uint64_t block_min(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_min(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_min(lane < warps ? scratch[lane] : kNone);
}

__device__ __forceinline__ uint64_t warp_inclusive_scan(uint64_t v, int lane) {
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint64_t up = MICROLLM_SHFL(v, lane >= offset ? lane - offset : lane);
    if (lane >= offset) v += up;
  }
  return v;
}

// Inclusive prefix sum over the block in thread order; *total receives the block's sum.
__device__ uint64_t block_inclusive_scan(uint64_t v, uint64_t* scratch, uint64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_inclusive_scan(v, lane);
  __syncthreads();
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const uint64_t s = warp_inclusive_scan(lane < warps ? scratch[lane] : 0, lane);
    if (lane < warps) scratch[lane] = s;
  }
  __syncthreads();
  if (warp > 0) v += scratch[warp - 1];
  *total = scratch[warps - 1];
  return v;
}

// The first i < limit (in key order) whose running weight passes `pass`, and that running weight; or -1 with
// the weight of the whole prefix. `scratch` holds 33 values of shared memory.
template <typename Weight, typename Pass>
__device__ int64_t first_passing(int64_t limit, const Weight& weight_at, const Pass& pass, uint64_t* scratch,
                                 uint64_t* cumulative) {
  uint64_t carry = 0;
  for (int64_t base = 0; base < limit; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const uint64_t w = i < limit ? weight_at(i) : 0;
    uint64_t tile_total;
    const uint64_t running = carry + block_inclusive_scan(w, scratch, &tile_total);
    const uint64_t first = block_min(i < limit && pass(running) ? static_cast<uint64_t>(i) : kNone, scratch);
    if (first != kNone) {
      if (static_cast<uint64_t>(i) == first) scratch[32] = running;
      __syncthreads();
      *cumulative = scratch[32];
      return static_cast<int64_t>(first);
    }
    carry += tile_total;
  }
  *cumulative = carry;
  return -1;
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    sample_prepare_kernel(Rows rows, uint64_t* keys, int* segment_begin, int* segment_end) {
  __shared__ uint64_t scratch[32];
  __shared__ unsigned long long written;
  const int64_t b = blockIdx.x;
  const RowParams p = params_of(rows, b);
  const T* logits = static_cast<const T*>(rows.logits) + b * rows.logits_row;
  const int32_t* counts = rows.counts != nullptr && p.penalized() ? rows.counts + b * rows.counts_row : nullptr;
  auto logit = [&](int64_t v) {
    return penalized(to_acc(logits[v * rows.logits_col]), counts != nullptr ? counts[v * rows.counts_col] : 0, p);
  };
  uint64_t first = kNone;
  for (int64_t v = threadIdx.x; v < rows.vocab; v += blockDim.x) first = min(first, rank_key(logit(v), v));
  first = block_min(first, scratch);
  const int64_t segment = b * rows.vocab;
  if (p.greedy()) {
    if (threadIdx.x == 0) {
      segment_begin[b] = static_cast<int>(segment);
      segment_end[b] = static_cast<int>(segment);
      finish_row(rows, b, key_id(first));
    }
    return;
  }
  // The candidates that weigh anything, appended warp by warp (one shared atomic per warp and tile).
  const float max = key_logit(first);
  if (threadIdx.x == 0) written = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int64_t base = 0; base < rows.vocab; base += blockDim.x) {
    const int64_t v = base + threadIdx.x;
    float x = 0;
    bool keep = false;
    if (v < rows.vocab) {
      x = logit(v);
      keep = weight(x, max, p.temperature) > 0;
    }
    const unsigned ballot = MICROLLM_BALLOT(keep);
    if (ballot == 0) continue;  // the same for every lane of the warp
    unsigned long long at = 0;
    if (lane == 0) at = atomicAdd(&written, static_cast<unsigned long long>(__popc(ballot)));
    at = MICROLLM_SHFL(at, 0);
    if (keep) keys[segment + static_cast<int64_t>(at) + __popc(ballot & ((1u << lane) - 1u))] = rank_key(x, v);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    segment_begin[b] = static_cast<int>(segment);
    segment_end[b] = static_cast<int>(segment + static_cast<int64_t>(written));
  }
}

__global__ void __launch_bounds__(kBlock)
    sample_choose_kernel(Rows rows, const uint64_t* sorted, const int* segment_end) {
  __shared__ uint64_t scratch[33];
  const int64_t b = blockIdx.x;
  const RowParams p = params_of(rows, b);
  if (p.greedy()) return;  // chosen by the prepare kernel
  const uint64_t* keys = sorted + b * rows.vocab;
  const int64_t count = segment_end[b] - b * rows.vocab;  // >= 1: the maximum weighs 2^31
  const int64_t n = min(count, p.top_k_limit(rows.vocab));
  const float max = key_logit(keys[0]);
  auto weight_at = [&](int64_t i) -> uint64_t { return weight(key_logit(keys[i]), max, p.temperature); };
  // Read before thread 0 advances the offset at the very end.
  const int64_t* state = rows.rng + b * rows.rng_row;
  const float u = draw_uniform(static_cast<uint64_t>(state[0]), static_cast<uint64_t>(state[rows.rng_col]));

  uint64_t total = 0, cut = static_cast<uint64_t>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t w = weight(key_logit(keys[i]), max, p.temperature);
    total += w;
    if (i >= 1 && below_min_p(w, p)) cut = min(cut, static_cast<uint64_t>(i));
  }
  total = block_sum(total, scratch);
  int64_t keep = static_cast<int64_t>(block_min(cut, scratch));
  uint64_t kept = 0;
  const int64_t top_p_end = first_passing(
      keep, weight_at, [&](uint64_t running) { return top_p_on(p) && reaches_top_p(running, total, p); }, scratch,
      &kept);
  if (top_p_end >= 0) keep = top_p_end + 1;
  const double target = draw_target(u, kept);
  uint64_t unused = 0;
  int64_t chosen = first_passing(
      keep, weight_at, [&](uint64_t running) { return passes_target(running, target); }, scratch, &unused);
  if (chosen < 0) chosen = keep - 1;  // unreachable: u < 1 puts the target below the kept weight
  if (threadIdx.x == 0) finish_row(rows, b, key_id(keys[chosen]));
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                                const Tensor& out) {
  OpScope scope("sample_tokens", device_, detail::current_cuda_stream(device_));
  const int64_t batch = logits.size(0), vocab = logits.size(1);
  MICROLLM_CHECK(batch * vocab <= INT32_MAX, NotSupportedError, "sample_tokens", "a batch of ", batch, " rows of ",
                 vocab, " logits exceeds the sort's i32 item count");
  Launch launch(out);
  Rows rows{};
  rows.logits = logits.data_ptr();
  rows.logits_row = logits.stride(0);
  rows.logits_col = logits.stride(1);
  rows.params = static_cast<const float*>(params.data_ptr());
  rows.params_row = params.stride(0);
  rows.params_col = params.stride(1);
  rows.rng = static_cast<int64_t*>(rng.data_ptr());
  rows.rng_row = rng.stride(0);
  rows.rng_col = rng.stride(1);
  if (counts.defined()) {
    rows.counts = static_cast<int32_t*>(counts.data_ptr());
    rows.counts_row = counts.stride(0);
    rows.counts_col = counts.stride(1);
  }
  rows.out = static_cast<int32_t*>(out.data_ptr());
  rows.out_stride = out.stride(0);
  rows.vocab = vocab;

  // Workspace: the candidates' keys before and after the sort, and each row's segment [begin, end).
  const Tensor keys_in = Tensor::empty({batch, vocab}, DType::i64, out.device());
  const Tensor keys_out = Tensor::empty({batch, vocab}, DType::i64, out.device());
  const Tensor segments = Tensor::empty({2, batch}, DType::i32, out.device());
  auto* unsorted = static_cast<uint64_t*>(keys_in.data_ptr());
  auto* sorted = static_cast<uint64_t*>(keys_out.data_ptr());
  int* begin = static_cast<int*>(segments.data_ptr());
  int* end = begin + batch;

  const auto grid = static_cast<unsigned>(batch);
  visit_float(logits.dtype(), "sample_tokens", [&]<typename T>() {
    sample_prepare_kernel<T><<<grid, kBlock, 0, launch.stream>>>(rows, unsorted, begin, end);
  });
  MICROLLM_CUDA_CHECK_LAUNCH();
  const int items = static_cast<int>(batch * vocab), segment_count = static_cast<int>(batch);
  size_t temp_bytes = 0;
  MICROLLM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, temp_bytes, unsorted, sorted, items,
                                                              segment_count, begin, end, 0, 64, launch.stream));
  const Tensor temp = Tensor::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::u8, out.device());
  MICROLLM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(temp.data_ptr(), temp_bytes, unsorted, sorted, items,
                                                              segment_count, begin, end, 0, 64, launch.stream));
  sample_choose_kernel<<<grid, kBlock, 0, launch.stream>>>(rows, sorted, end);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

}  // namespace microllm
