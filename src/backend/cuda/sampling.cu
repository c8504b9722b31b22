// CUDA sampling: the rule of microllm/backend/sampling_math.h on the device, with no host wait.
//   1. max (a block per row and vocabulary chunk): each chunk's first maximum of the adjusted logits (bias and
//      penalties). A grid of (rows x chunks) sized to fill the GPU reads the vocabulary once, in parallel (one
//      block per row would be a chain of dependent loads a thread; docs/perf/kernels.md#sampling).
//   2. prepare (a block per row and chunk): the row's first maximum from its chunks' partials; a greedy row
//      ends here (id, counts, offset). For a sampled row each block appends the keys (sampling::rank_key) of
//      its chunk's candidates that weigh anything to the row's segment of a [B, V] u64 workspace, in any order
//      (keys are unique), advancing the segment's end with global atomics.
//   3. cub::DeviceSegmentedRadixSort sorts every segment (a greedy row's is empty). In a real model's logits at
//      T <= 1 few tokens weigh anything (those within ~21 nats of the maximum), so segments are short.
//   4. choose (a block per sampled row): block-wide sums and scans of the exact integer weights over the sorted
//      keys: the top-k total, the min-p cut, the top-p cut, then the draw. The integers are the ones the CPU
//      loop adds, so the id is the CPU's; then id, counts and offset are written.
// With SamplerRows::greedy_only the call is steps 1 and 2 alone, step 2 one block per row: the sort alone is
// 11 launches even when every segment is empty.
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>

#include "../../core/cuda/device_errors.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "microllm/backend/sampling_math.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

using namespace sampling;
using detail::DeviceErrorCode;
using detail::report_device_error;

constexpr int kBlock = 1024;         // the choose kernel: a block per row
constexpr int kChunkThreads = 256;   // the max and prepare kernels: a block per (row, chunk)
constexpr int kLoads = 4;            // logits a thread of those loads before using any
// Chunks of the vocabulary: enough blocks over the batch to fill the GPU twice over, but no chunk under
// kMinChunk logits (one round of kLoads loads per thread) or, while the chunk count allows, over kMaxChunk;
// at most kMaxChunks per row, because every block of step 2 reads all of its row's partials.
constexpr int64_t kMinChunk = kChunkThreads * kLoads, kMaxChunk = 4096, kMaxChunks = 1024;
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
  const float* bias;  // nullptr: no logit bias
  int64_t bias_row, bias_col;
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

// The row's logits as the kernels read them: biased and penalized, NaN as -inf (sampling::adjusted).
template <typename T>
struct RowLogits {
  const T* logits;
  int64_t stride;
  const int32_t* counts;  // nullptr: the row has no penalties
  int64_t counts_stride;
  const float* bias;  // nullptr: the row has no logit bias
  int64_t bias_stride;
  RowParams p;

  __device__ RowLogits(const Rows& rows, int64_t b)
      : logits(static_cast<const T*>(rows.logits) + b * rows.logits_row),
        stride(rows.logits_col),
        counts(nullptr),
        counts_stride(rows.counts_col),
        bias(nullptr),
        bias_stride(rows.bias_col),
        p(params_of(rows, b)) {
    if (rows.counts != nullptr && p.penalized()) counts = rows.counts + b * rows.counts_row;
    if (rows.bias != nullptr && p.biased()) bias = rows.bias + b * rows.bias_row;
  }
  // Ids v, v + kChunkThreads, ... (kLoads of them, those < end) loaded before any is used, so that a thread
  // has kLoads loads in flight instead of one dependent load per step.
  __device__ __forceinline__ void load(int64_t v, int64_t end, float (&x)[kLoads]) const {
    int32_t seen[kLoads];
    float added[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t id = v + i * kChunkThreads;
      x[i] = id < end ? to_acc(logits[id * stride]) : 0.0f;
      seen[i] = id < end && counts != nullptr ? counts[id * counts_stride] : 0;
      added[i] = id < end && bias != nullptr ? bias[id * bias_stride] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) x[i] = adjusted(x[i], added[i], seen[i], p);
  }
};

// Step 1, grid (B rows, C chunks): the minimum rank_key of the penalized logits of chunk c of row b, i.e. the
// chunk's first maximum, to partial[b * C + c]. The minimum of a row's partials is then the row's first
// maximum, exactly: keys are unique and totally ordered, so ties across chunk boundaries still go to the
// lowest id. Block (b, 0) also resets row b's segment [b * V, b * V) that step 2 appends to (nullptr when
// greedy_only: there are no segments), so a replayed graph needs no memset node.
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    sample_max_kernel(Rows rows, int64_t chunk, uint64_t* partial, int* segment_begin, int* segment_end) {
  __shared__ uint64_t scratch[32];
  const int64_t b = blockIdx.x, c = blockIdx.y;
  wait_for_prior_grids();  // the logits
  chain_next_grids();
  if (c == 0 && threadIdx.x == 0 && segment_begin != nullptr) {
    segment_begin[b] = static_cast<int>(b * rows.vocab);
    segment_end[b] = static_cast<int>(b * rows.vocab);
  }
  const RowLogits<T> row(rows, b);
  const int64_t begin = c * chunk, end = min(begin + chunk, rows.vocab);
  uint64_t first = kNone;
  for (int64_t v = begin + threadIdx.x; v < end; v += kChunkThreads * kLoads) {
    float x[kLoads];
    row.load(v, end, x);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t id = v + i * kChunkThreads;
      if (id < end) first = min(first, rank_key(x[i], id));
    }
  }
  first = block_min(first, scratch);
  if (threadIdx.x == 0) partial[b * gridDim.y + c] = first;
}

// Step 2, grid (B rows, C chunks), or (B, 1) with kGreedyOnly: every block takes its row's first maximum from
// the C partials. A greedy row ends here (block (b, 0): id, counts, offset). With kGreedyOnly a row that is
// not greedy is reported through the device error word (and still gets the first maximum, an id in range,
// so that later kernels report nothing else over it). Otherwise block (b, c) appends the keys of chunk c's
// candidates that weigh anything to row b's segment of the [B, V] workspace, one global atomic per warp and
// step on the segment's end; the order inside the segment varies from run to run, the sort fixes it.
template <typename T, bool kGreedyOnly>
__global__ void __launch_bounds__(kChunkThreads)
    sample_prepare_kernel(Rows rows, int64_t chunk, const uint64_t* partial, int chunks, uint64_t* keys,
                          int* segment_end, uint64_t* error_word) {
  __shared__ uint64_t scratch[32];
  const int64_t b = blockIdx.x, c = blockIdx.y;
  wait_for_prior_grids();  // the partials
  chain_next_grids();
  const RowParams p = params_of(rows, b);
  const bool greedy = kGreedyOnly || p.greedy();
  if (greedy && c != 0) return;  // the whole block: p is the row's
  uint64_t first = kNone;
  for (int i = threadIdx.x; i < chunks; i += kChunkThreads) first = min(first, partial[b * chunks + i]);
  first = block_min(first, scratch);
  if (greedy) {
    if (threadIdx.x == 0) {
      if (kGreedyOnly && !p.greedy()) report_device_error(error_word, DeviceErrorCode::sample_not_greedy, b);
      finish_row(rows, b, key_id(first));
    }
    return;
  }
  const RowLogits<T> row(rows, b);
  const float max = key_logit(first);
  const int lane = threadIdx.x % 32;
  const int64_t begin = c * chunk, end = min(begin + chunk, rows.vocab);
  // Every lane of a warp runs the same iterations (the bound does not depend on the lane): ballots are whole.
  for (int64_t base = begin; base < end; base += kChunkThreads * kLoads) {
    const int64_t v = base + threadIdx.x;
    float x[kLoads];
    row.load(v, end, x);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t id = v + i * kChunkThreads;
      const bool keep = id < end && weight(x[i], max, p.temperature) > 0;
      const unsigned ballot = MICROLLM_BALLOT(keep);
      if (ballot == 0) continue;  // the same for every lane of the warp
      int at = 0;
      if (lane == 0) at = atomicAdd(segment_end + b, __popc(ballot));
      at = MICROLLM_SHFL(at, 0);
      if (keep) keys[static_cast<int64_t>(at) + __popc(ballot & ((1u << lane) - 1u))] = rank_key(x[i], id);
    }
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

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How the vocabulary is cut: chunk logits per block (a multiple of kChunkThreads), count chunks per row. From
// host-known shapes and the SM count only, so a graph's launches stay right for every replay.
struct Chunks {
  int64_t size;
  int64_t count;
};
Chunks choose_chunks(int64_t batch, int64_t vocab, int multiprocessors) {
  const int64_t wanted = ceil_div(2 * static_cast<int64_t>(multiprocessors), batch);
  int64_t count = std::clamp(wanted, ceil_div(vocab, kMaxChunk), ceil_div(vocab, kMinChunk));
  count = std::min(count, kMaxChunks);
  const int64_t size = ceil_div(ceil_div(vocab, count), kChunkThreads) * kChunkThreads;
  return {size, ceil_div(vocab, size)};  // no empty chunk after the rounding up
}

}  // namespace

void CudaBackend::sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                                const Tensor& bias, bool greedy_only, const Tensor& out) {
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
  if (bias.defined()) {
    rows.bias = static_cast<const float*>(bias.data_ptr());
    rows.bias_row = bias.stride(0);
    rows.bias_col = bias.stride(1);
  }
  rows.out = static_cast<int32_t*>(out.data_ptr());
  rows.out_stride = out.stride(0);
  rows.vocab = vocab;

  const Chunks chunks = choose_chunks(batch, vocab, multiprocessor_count(launch.device));
  const Tensor partials = Tensor::empty({batch, chunks.count}, DType::i64, out.device());
  auto* partial = static_cast<uint64_t*>(partials.data_ptr());
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(chunks.count));
  const dim3 row_grid(static_cast<unsigned>(batch), 1);
  uint64_t* error_word = detail::cuda_error_word(launch.device);

  // Workspace past the max pass (not for greedy_only): the candidates' keys before and after the sort, and
  // each row's segment [begin, end).
  Tensor keys_in, keys_out, segments;
  uint64_t *unsorted = nullptr, *sorted = nullptr;
  int *begin = nullptr, *end = nullptr;
  if (!greedy_only) {
    keys_in = Tensor::empty({batch, vocab}, DType::i64, out.device());
    keys_out = Tensor::empty({batch, vocab}, DType::i64, out.device());
    segments = Tensor::empty({2, batch}, DType::i32, out.device());
    unsorted = static_cast<uint64_t*>(keys_in.data_ptr());
    sorted = static_cast<uint64_t*>(keys_out.data_ptr());
    begin = static_cast<int*>(segments.data_ptr());
    end = begin + batch;
  }
  visit_float(logits.dtype(), "sample_tokens", [&]<typename T>() {
    // Chained (inside a captured decode step): each launch overlaps the tail of the kernel before it.
    launch_chained(sample_max_kernel<T>, grid, kChunkThreads, 0, launch.stream, launch.device, rows, chunks.size,
                   partial, begin, end);
    const auto prepare = greedy_only ? sample_prepare_kernel<T, true> : sample_prepare_kernel<T, false>;
    launch_chained(prepare, greedy_only ? row_grid : grid, kChunkThreads, 0, launch.stream, launch.device, rows,
                   chunks.size, partial, static_cast<int>(chunks.count), unsorted, end, error_word);
  });
  if (greedy_only) return;  // every row finished in the prepare kernel
  const int items = static_cast<int>(batch * vocab), segment_count = static_cast<int>(batch);
  size_t temp_bytes = 0;
  MICROLLM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, temp_bytes, unsorted, sorted, items,
                                                              segment_count, begin, end, 0, 64, launch.stream));
  const Tensor temp = Tensor::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::u8, out.device());
  MICROLLM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(temp.data_ptr(), temp_bytes, unsorted, sorted, items,
                                                              segment_count, begin, end, 0, 64, launch.stream));
  sample_choose_kernel<<<dim3(static_cast<unsigned>(batch)), kBlock, 0, launch.stream>>>(rows, sorted, end);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

}  // namespace microllm
