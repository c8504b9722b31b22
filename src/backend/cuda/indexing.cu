// CUDA topk, scatter_add, embedding and embedding_backward.
//
// topk (last dim; descending, ties to the lower index, NaN largest; the CPU's exact answer). Each value
// maps to an unsigned key whose order is that order (-0 and +0 share a key, every NaN gets the largest),
// and entries sort by (key descending, index ascending), a strict total order.
// - k <= kSortCap: a block per row. Rows of up to kSortCap elements are sorted whole in shared memory.
//   Longer rows: a radix select finds the k-th key 8 bits at a time (a 256-bin shared histogram per pass,
//   warp-aggregated atomics; the pass stops early once the bin holds exactly the missing entries), one
//   more pass gathers the winners (the keys above it, and the lowest-index ties: all ties when they fit,
//   else in index order through a block scan), and a bitonic sort orders them. A bf16 row of 151936
//   elements is read three times (two 8-bit passes and the gather), with 16-byte loads.
// - larger k: each row is sorted whole in global memory (bitonic runs of kSortCap, then merge passes
//   in which each entry finds its place by binary search in the other run), rows in batches that keep
//   the scratch below kSortScratchBytes.
// scatter_add: a thread per line along `dim` adds the line's sources in order (the CPU's order, no
// atomics: deterministic). Indices outside the dim are reported (scatter_index) and skipped.
// embedding: a warp per id copies the row, in 16-byte units when rows are contiguous and aligned; a bad
// id is reported (embedding_id) and its row is written as zeros.
// embedding_backward (deterministic, no atomics): the (id, position) pairs are sorted with the topk sort;
// the sorted list is cut into windows of kWindow entries; a block per window sums each run of equal ids
// in f32 (f64) in position order and writes a whole id's row directly, or parks a partial sum for ids
// that cross a window boundary; a second kernel adds those partials in order. grad_weight is zeroed
// first; only the rows of ids that occur are written again.
#include "../../core/cuda/device_errors.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels {
namespace {

using rows::ceil_div;
using rows::kPack;
using rows::Pack;

constexpr int kSortCap = 2048;      // entries a block sorts in shared memory (a power of two)
constexpr int kSortThreads = 1024;  // threads of the sorting and selecting blocks
constexpr int64_t kSortScratchBytes = int64_t{256} << 20;
constexpr int64_t kWindow = 32;  // embedding_backward: sorted entries per window
constexpr unsigned kMaxBlocks = 1u << 20;

// ---- order keys: key(a) > key(b) exactly when a comes before b in topk's order (equal values, and
// every NaN, share a key) ----
template <typename T>
using order_key_t = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
template <typename T>
constexpr int kKeyBits = 8 * static_cast<int>(sizeof(T));

// Floats: sign-magnitude bits made monotone (negative: all bits flipped; positive: the sign bit set).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;  // NaN
  if ((b & 0x7FFFFFFFu) == 0) b = 0;                        // -0 and +0 compare equal: one key
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint64_t order_key(double v) {
  constexpr uint64_t kSign = 1ull << 63;
  uint64_t b = static_cast<uint64_t>(__double_as_longlong(v));
  if ((b & ~kSign) > 0x7FF0000000000000ull) return ~0ull;
  if ((b & ~kSign) == 0) b = 0;
  return (b & kSign) ? ~b : (b | kSign);
}
// 16-bit floats: their bits (NaN: exponent all ones and a nonzero mantissa).
__device__ __forceinline__ uint32_t order_key16(uint32_t b, uint32_t inf_bits) {
  if ((b & 0x7FFFu) > inf_bits) return 0xFFFFu;
  if ((b & 0x7FFFu) == 0) b = 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}
__device__ __forceinline__ uint32_t order_key(__half v) { return order_key16(__half_as_ushort(v), 0x7C00u); }
__device__ __forceinline__ uint32_t order_key(__nv_bfloat16 v) { return order_key16(__bfloat16_as_ushort(v), 0x7F80u); }
__device__ __forceinline__ uint32_t order_key(int8_t v) { return static_cast<uint8_t>(v) ^ 0x80u; }
__device__ __forceinline__ uint32_t order_key(uint8_t v) { return v; }
__device__ __forceinline__ uint32_t order_key(int32_t v) { return static_cast<uint32_t>(v) ^ 0x80000000u; }
__device__ __forceinline__ uint64_t order_key(int64_t v) { return static_cast<uint64_t>(v) ^ (1ull << 63); }

// Entry a sorts before entry b: larger key first, then lower index.
template <typename K>
__device__ __forceinline__ bool before(K key_a, uint32_t index_a, K key_b, uint32_t index_b) {
  return key_a > key_b || (key_a == key_b && index_a < index_b);
}

__device__ __forceinline__ int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The lanes of this warp, among those active, whose `value` equals this lane's (match.any). A HIP port
// replaces this CUDA-only intrinsic (a ballot per bit of value).
__device__ __forceinline__ unsigned warp_peers(unsigned value) { return MICROLLM_MATCH_ANY(value); }

// Bitonic sort of keys/index[0, count) in shared memory into `before` order; [count, P) (P the power of
// two >= count, P <= the arrays' capacity) is padded with entries that sort last (key 0, index
// UINT32_MAX: real indices are smaller). Every thread of the block calls it; it ends synchronized.
template <typename K>
__device__ void block_sort(K* keys, uint32_t* index, int count) {
  const int size_all = pow2_at_least(count);
  for (int i = count + threadIdx.x; i < size_all; i += blockDim.x) {
    keys[i] = 0;
    index[i] = 0xFFFFFFFFu;
  }
  __syncthreads();
  for (int size = 2; size <= size_all; size <<= 1) {
    for (int half = size >> 1; half > 0; half >>= 1) {
      for (int t = threadIdx.x; t < size_all / 2; t += blockDim.x) {
        const int i = 2 * half * (t / half) + t % half;  // bit `half` of i is 0; its partner is i + half
        const int j = i + half;
        const K ki = keys[i], kj = keys[j];
        const uint32_t ii = index[i], ij = index[j];
        const bool ascending = (i & size) == 0;  // ascending in `before` order
        if (ascending ? before(kj, ij, ki, ii) : before(ki, ii, kj, ij)) {
          keys[i] = kj;
          keys[j] = ki;
          index[i] = ij;
          index[j] = ii;
        }
      }
      __syncthreads();
    }
  }
}

// Exclusive prefix sum of v over the block in thread order; `total` gets the block's sum. blockDim.x is
// a multiple of 32; scratch holds 32 ints of shared memory.
__device__ int block_exclusive_scan(int v, int* scratch, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int t = MICROLLM_SHFL(inclusive, lane >= offset ? lane - offset : 0);
    if (lane >= offset) inclusive += t;
  }
  __syncthreads();  // scratch may still be read by the previous call
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? scratch[lane] : 0;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int t = MICROLLM_SHFL(w, lane >= offset ? lane - offset : 0);
      if (lane >= offset) w += t;
    }
    scratch[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  total = scratch[warps - 1];
  return (warp > 0 ? scratch[warp - 1] : 0) + inclusive - v;
}

// ---- topk, k <= kSortCap: a block per row ----
template <typename T>
struct TopkArgs {
  const T* x;
  StridedMeta<1> rows;  // row r starts at x + offset(r)
  int64_t n_rows;
  int n;         // row length
  int64_t step;  // between a row's elements
  int k;
  int cap;           // shared-memory entries (a power of two <= kSortCap)
  T* values;         // [n_rows, k]
  int64_t* indices;  // [n_rows, k]
};

// Warp 0: the digit d at which the candidates' counts, summed from the top bin down, reach `need`; the
// entries still needed inside bin d; bin d's count. hist has 256 bins; lane l owns [8 l, 8 l + 8).
__device__ void select_digit(const uint32_t* hist, int need, int* digit, int* need_in_bin, int* bin_count) {
  const int lane = threadIdx.x % 32;
  uint32_t c[8];
  uint32_t local = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    c[b] = hist[lane * 8 + b];
    local += c[b];
  }
  uint32_t suffix = local;  // sum over lanes >= lane
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t t = MICROLLM_SHFL(suffix, lane + offset < 32 ? lane + offset : 31);
    if (lane + offset < 32) suffix += t;
  }
  const uint32_t above = suffix - local;  // lanes > lane
  const auto want = static_cast<uint32_t>(need);
  if (above < want && want <= suffix) {  // exactly one lane: the counts are monotone, the total >= need
    uint32_t running = above;
#pragma unroll
    for (int b = 7; b >= 0; --b) {
      if (running < want && running + c[b] >= want) {
        *digit = lane * 8 + b;
        *need_in_bin = static_cast<int>(want - running);
        *bin_count = static_cast<int>(c[b]);
      }
      running += c[b];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kSortThreads) topk_select_kernel(TopkArgs<T> args) {
  using K = order_key_t<T>;
  extern __shared__ __align__(16) unsigned char topk_smem[];
  K* keys = reinterpret_cast<K*>(topk_smem);
  uint32_t* index = reinterpret_cast<uint32_t*>(keys + args.cap);
  __shared__ uint32_t hist[256];
  __shared__ int s_digit, s_need, s_count, s_slots;
  __shared__ int scan_scratch[32];
  const int tid = threadIdx.x, lane = tid % 32;
  for (int64_t r = blockIdx.x; r < args.n_rows; r += gridDim.x) {
    int64_t off[1];
    args.rows.offsets(r, off);
    const T* row = args.x + off[0];
    // Candidates: entries whose key matches `prefix` on the bits of `mask`; `need` of them are winners;
    // count_eq of them exist. Entries above the prefix are all winners (k - need of them).
    K prefix = 0, mask = 0;
    int need = args.k, count_eq = args.n;
    if (args.n > args.cap) {
      for (int shift = kKeyBits<T> - 8; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        rows::visit_row(row, args.n, args.step, tid, blockDim.x, [&](int64_t, const T* v, int count) {
#pragma unroll
          for (int j = 0; j < kPack<T> && j < count; ++j) {
            const K key = order_key(v[j]);
            const unsigned digit = (key & mask) == prefix ? static_cast<unsigned>((key >> shift) & 255u) : 256u;
            const unsigned peers = warp_peers(digit);
            if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<uint32_t>(__popc(peers)));
          }
        });
        __syncthreads();
        if (tid < 32) select_digit(hist, need, &s_digit, &s_need, &s_count);
        __syncthreads();
        prefix |= static_cast<K>(s_digit) << shift;
        mask |= static_cast<K>(255u) << shift;
        need = s_need;
        count_eq = s_count;
        if (count_eq == need) break;  // every candidate is a winner: no ties to break
      }
    }
    const int greater = args.k - need;
    if (tid == 0) s_slots = 0;
    __syncthreads();
    int total;
    if (greater + count_eq <= args.cap) {
      // Every winner and every tie fits: gather all; the sort puts ties in index order.
      total = greater + count_eq;
      rows::visit_row(row, args.n, args.step, tid, blockDim.x, [&](int64_t i, const T* v, int count) {
#pragma unroll
        for (int j = 0; j < kPack<T> && j < count; ++j) {
          const K key = order_key(v[j]);
          if ((key & mask) >= prefix) {
            const int slot = atomicAdd(&s_slots, 1);
            keys[slot] = key;
            index[slot] = static_cast<uint32_t>(i + j);
          }
        }
      });
    } else {
      // Too many ties: the entries above go anywhere in [0, greater); the first `need` ties in index order
      // go to [greater, k), ranked by a block scan per stretch of blockDim.x elements.
      total = args.k;
      int taken = 0;
      for (int64_t base = 0; base < args.n; base += blockDim.x) {
        const int64_t i = base + tid;
        K key = 0;
        bool above = false, tie = false;
        if (i < args.n) {
          key = order_key(row[i * args.step]);
          above = (key & mask) > prefix;
          tie = (key & mask) == prefix;
        }
        if (above) {
          const int slot = atomicAdd(&s_slots, 1);
          keys[slot] = key;
          index[slot] = static_cast<uint32_t>(i);
        }
        int stretch_ties = 0;
        const int rank = block_exclusive_scan(tie ? 1 : 0, scan_scratch, stretch_ties);
        if (tie && taken + rank < need) {
          keys[greater + taken + rank] = key;
          index[greater + taken + rank] = static_cast<uint32_t>(i);
        }
        taken += stretch_ties;
      }
    }
    __syncthreads();
    block_sort(keys, index, total);
    for (int j = tid; j < args.k; j += blockDim.x) {
      const uint32_t i = index[j];
      args.values[r * args.k + j] = row[static_cast<int64_t>(i) * args.step];
      args.indices[r * args.k + j] = i;
    }
    __syncthreads();  // the next row reuses shared memory
  }
}

// ---- sorting whole rows in global memory (topk with large k; embedding_backward) ----
// A loader gives entry i of row r: row(r) once per chunk, then load(row, i, key, index).
template <typename T>
struct TopkLoader {
  const T* x;
  StridedMeta<1> rows;
  int64_t step;
  int64_t row0;  // the batch's first row
  __device__ const T* row(int64_t r) const {
    int64_t off[1];
    rows.offsets(row0 + r, off);
    return x + off[0];
  }
  __device__ void load(const T* row, int64_t i, order_key_t<T>& key, uint32_t& index) const {
    key = order_key(row[i * step]);
    index = static_cast<uint32_t>(i);
  }
};

// Sorts each run of kSortCap entries of each of `rows` rows of n; keys_out/index_out are [rows, n].
template <typename K, typename Loader>
__global__ void __launch_bounds__(kSortThreads)
    sort_chunks_kernel(Loader loader, int64_t n_rows, int64_t n, K* __restrict__ keys_out,
                       uint32_t* __restrict__ index_out) {
  __shared__ K keys[kSortCap];
  __shared__ uint32_t index[kSortCap];
  const int64_t chunks = (n + kSortCap - 1) / kSortCap;
  for (int64_t b = blockIdx.x; b < n_rows * chunks; b += gridDim.x) {
    const int64_t r = b / chunks, start = b % chunks * kSortCap;
    const int len = static_cast<int>(std::min<int64_t>(kSortCap, n - start));
    const auto row = loader.row(r);
    for (int i = threadIdx.x; i < len; i += blockDim.x) loader.load(row, start + i, keys[i], index[i]);
    block_sort(keys, index, len);  // begins with a barrier: the loads above are visible
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      keys_out[r * n + start + i] = keys[i];
      index_out[r * n + start + i] = index[i];
    }
    __syncthreads();
  }
}

// Merges sorted runs [2jw, 2jw + w) and [2jw + w, 2jw + 2w) of each row: an entry's place is its rank in
// its own run plus the number of entries of the other run that sort before it (a strict order: unique).
template <typename K>
__global__ void merge_runs_kernel(const K* __restrict__ keys_in, const uint32_t* __restrict__ index_in,
                                  K* __restrict__ keys_out, uint32_t* __restrict__ index_out, int64_t n_rows, int64_t n,
                                  int64_t width) {
  MICROLLM_GRID_STRIDE_LOOP(e, n_rows * n) {
    const int64_t r = e / n, i = e % n;
    const K* kr = keys_in + r * n;
    const uint32_t* ir = index_in + r * n;
    const int64_t a0 = i / (2 * width) * (2 * width), b0 = a0 + width;
    const K key = kr[i];
    const uint32_t id = ir[i];
    int64_t other, other_len, rank;
    if (i < b0) {
      other = b0;
      other_len = std::max<int64_t>(0, std::min(width, n - b0));
      rank = i - a0;
    } else {
      other = a0;
      other_len = width;
      rank = i - b0;
    }
    int64_t lo = 0, hi = other_len;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (before(kr[other + mid], ir[other + mid], key, id))
        lo = mid + 1;
      else
        hi = mid;
    }
    keys_out[r * n + a0 + rank + lo] = key;
    index_out[r * n + a0 + rank + lo] = id;
  }
}

// Sorts n_rows rows of n loaded entries in `before` order using the buffers a and b; returns the one
// that holds the result.
template <typename K, typename Loader>
std::pair<K*, uint32_t*> sort_rows(const Loader& loader, int64_t n_rows, int64_t n, K* keys_a, uint32_t* index_a,
                                   K* keys_b, uint32_t* index_b, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(n_rows * ceil_div(n, kSortCap), kMaxBlocks);
  sort_chunks_kernel<K, Loader>
      <<<static_cast<unsigned>(blocks), kSortThreads, 0, stream>>>(loader, n_rows, n, keys_a, index_a);
  MICROLLM_CUDA_CHECK_LAUNCH();
  for (int64_t width = kSortCap; width < n; width *= 2) {
    merge_runs_kernel<K>
        <<<grid_for(n_rows * n), kThreads, 0, stream>>>(keys_a, index_a, keys_b, index_b, n_rows, n, width);
    MICROLLM_CUDA_CHECK_LAUNCH();
    std::swap(keys_a, keys_b);
    std::swap(index_a, index_b);
  }
  return {keys_a, index_a};
}

// The first k of each sorted row: values read back from x at the sorted indices.
template <typename T>
__global__ void topk_gather_kernel(TopkLoader<T> loader, const uint32_t* __restrict__ sorted, int64_t n_rows, int64_t n,
                                   int64_t k, T* __restrict__ values, int64_t* __restrict__ indices) {
  MICROLLM_GRID_STRIDE_LOOP(e, n_rows * k) {
    const int64_t r = e / k, j = e % k;
    const uint32_t i = sorted[r * n + j];
    values[(loader.row0 + r) * k + j] = loader.row(r)[static_cast<int64_t>(i) * loader.step];
    indices[(loader.row0 + r) * k + j] = i;
  }
}

// ---- scatter_add ----
// Line l (src's shape with `dim` of size 1): meta operands out, src, index. The line's sources are added
// in order by one thread; lines touch disjoint parts of out.
template <typename T>
__global__ void scatter_add_kernel(const int64_t* __restrict__ index, const T* __restrict__ src, T* __restrict__ out,
                                   StridedMeta<3> meta, int64_t lines, int64_t n_src, int64_t n_out, int64_t index_step,
                                   int64_t src_step, int64_t out_step, uint64_t* error_word) {
  MICROLLM_GRID_STRIDE_LOOP(l, lines) {
    int64_t off[3];
    meta.offsets(l, off);
    for (int64_t j = 0; j < n_src; ++j) {
      const int64_t id = index[off[2] + j * index_step];
      if (id < 0 || id >= n_out) {
        detail::report_device_error(error_word, detail::DeviceErrorCode::scatter_index, id);
        continue;
      }
      T* target = out + off[0] + id * out_step;
      const T v = src[off[1] + j * src_step];
      if constexpr (std::is_integral_v<T>)
        *target = static_cast<T>(static_cast<int64_t>(*target) + static_cast<int64_t>(v));
      else
        *target = from_acc<T>(to_acc(*target) + to_acc(v));
    }
  }
}

// ---- embedding ----
// A warp per id: out[n, :] = weight[id, :] in units U (16 bytes, or one element when the rows are
// strided or unaligned). width: units per row; weight's row `row_stride` and unit `unit_stride` apart.
template <typename U, typename I>
__global__ void embedding_kernel(const U* __restrict__ weight, int64_t row_stride, int64_t unit_stride,
                                 const I* __restrict__ ids, StridedMeta<1> ids_meta, int64_t count, int64_t vocab,
                                 int64_t width, U* __restrict__ out, uint64_t* error_word) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; n < count; n += warps) {
    int64_t off[1];
    ids_meta.offsets(n, off);
    const auto id = static_cast<int64_t>(ids[off[0]]);
    U* o = out + n * width;
    if (id < 0 || id >= vocab) {
      if (lane == 0) detail::report_device_error(error_word, detail::DeviceErrorCode::embedding_id, id);
      for (int64_t c = lane; c < width; c += 32) o[c] = U{};
      continue;
    }
    const U* w = weight + id * row_stride;
    for (int64_t c = lane; c < width; c += 32) o[c] = w[c * unit_stride];
  }
}

template <typename U>
__global__ void zero_kernel(U* __restrict__ p, int64_t n) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) p[i] = U{};
}

// Zeroes a contiguous tensor.
void zero_fill(const Tensor& t, cudaStream_t stream) {
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  if (bytes == 0) return;
  void* p = t.data_ptr();
  if (rows::aligned16(p) && bytes % 16 == 0) {
    zero_kernel<uint4><<<grid_for(bytes / 16), kThreads, 0, stream>>>(static_cast<uint4*>(p), bytes / 16);
  } else {
    zero_kernel<uint8_t><<<grid_for(bytes), kThreads, 0, stream>>>(static_cast<uint8_t*>(p), bytes);
  }
  MICROLLM_CUDA_CHECK_LAUNCH();
}

// ---- embedding_backward ----
// Sorted entries: key ~id (so `before` order is ascending id, then ascending position), index = position.
// Bad ids get key 0 (they sort last; ~0 is past every vocabulary) and are reported.
template <typename I>
struct EmbeddingLoader {
  const I* ids;
  int64_t stride;
  int64_t vocab;
  uint64_t* error_word;
  __device__ const I* row(int64_t) const { return ids; }
  __device__ void load(const I*, int64_t i, uint32_t& key, uint32_t& index) const {
    const auto id = static_cast<int64_t>(ids[i * stride]);
    if (id < 0 || id >= vocab) {
      detail::report_device_error(error_word, detail::DeviceErrorCode::embedding_id, id);
      key = 0;
    } else {
      key = ~static_cast<uint32_t>(id);
    }
    index = static_cast<uint32_t>(i);
  }
};

template <typename T>
struct BackwardArgs {
  const T* grad;               // [N, D]
  int64_t grad_row, grad_col;  // strides (grad_col is 1 on the vectorized path)
  const uint32_t* keys;        // [N] sorted
  const uint32_t* positions;   // [N] sorted
  int64_t n, vocab, dim;
  T* grad_weight;   // [vocab, D] contiguous, zeroed
  acc_t<T>* lead;   // [windows, D]: the sum of the run that starts a window and crosses into it
  acc_t<T>* trail;  // [windows, D]: the sum of a window's last run that starts an id and goes on
};

template <typename T, int V>
__device__ __forceinline__ void add_grad_row(const BackwardArgs<T>& a, uint32_t position, int64_t col,
                                             acc_t<T> (&acc)[V]) {
  const T* g = a.grad + position * a.grad_row;
  if constexpr (V > 1) {
    const Pack<V, T> pack = *reinterpret_cast<const Pack<V, T>*>(g + col);
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] += to_acc(pack.v[v]);
  } else {
    acc[0] += to_acc(g[col * a.grad_col]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_grad_row(const BackwardArgs<T>& a, uint32_t id, int64_t col,
                                               const acc_t<T> (&acc)[V]) {
  T* dst = a.grad_weight + static_cast<int64_t>(id) * a.dim + col;
  if constexpr (V > 1) {
    Pack<V, T> pack;
#pragma unroll
    for (int v = 0; v < V; ++v) pack.v[v] = from_acc<T>(acc[v]);
    *reinterpret_cast<Pack<V, T>*>(dst) = pack;
  } else {
    dst[0] = from_acc<T>(acc[0]);
  }
}

// Block (x: column groups of V, y: column chunk) per window of sorted entries.
template <typename T, int V>
__global__ void embedding_backward_windows(BackwardArgs<T> a) {
  using A = acc_t<T>;
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (col >= a.dim) return;
  const int64_t w = blockIdx.x, start = w * kWindow, end = std::min(a.n, start + kWindow);
  A acc[V];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = 0;
  int64_t run_start = start;
  uint32_t run_key = a.keys[start];
  // A run [rs, re) of key `key` ends: the whole id's sum goes to grad_weight; a part, to a partial slot.
  auto flush = [&](int64_t rs, int64_t re, uint32_t key) {
    const uint32_t id = ~key;
    if (static_cast<int64_t>(id) >= a.vocab) return;  // bad ids
    const bool starts_id = rs == 0 || a.keys[rs - 1] != key;
    const bool ends_id = re == a.n || a.keys[re] != key;
    if (starts_id && ends_id) {
      store_grad_row<T, V>(a, id, col, acc);
    } else {
      // A partial run either starts the window (lead) or is the window's last run and starts the id (trail).
      A* slot = (rs % kWindow == 0 ? a.lead : a.trail) + w * a.dim + col;
#pragma unroll
      for (int v = 0; v < V; ++v) slot[v] = acc[v];
    }
  };
  for (int64_t p = start; p < end; ++p) {
    const uint32_t key = a.keys[p];
    if (key != run_key) {
      flush(run_start, p, run_key);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = 0;
      run_start = p;
      run_key = key;
    }
    add_grad_row<T, V>(a, a.positions[p], col, acc);
  }
  flush(run_start, end, run_key);
}

// Block per window: if the window's last run starts an id that continues into later windows, add the
// id's partial sums in order (this window's, then each later window's lead) and write its row.
template <typename T, int V>
__global__ void embedding_backward_long_ids(BackwardArgs<T> a) {
  using A = acc_t<T>;
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (col >= a.dim) return;
  const int64_t w = blockIdx.x, start = w * kWindow, end = std::min(a.n, start + kWindow);
  if (end >= a.n) return;
  const uint32_t key = a.keys[end - 1];
  if (a.keys[end] != key) return;  // the last run ends in this window
  int64_t rs = end - 1;
  while (rs > start && a.keys[rs - 1] == key) --rs;
  if (rs == start && start > 0 && a.keys[start - 1] == key) return;  // the id started in an earlier window
  const uint32_t id = ~key;
  if (static_cast<int64_t>(id) >= a.vocab) return;
  const A* first = (rs % kWindow == 0 ? a.lead : a.trail) + w * a.dim + col;
  A acc[V];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = first[v];
  for (int64_t b = end; b < a.n && a.keys[b] == key; b += kWindow) {
    const A* part = a.lead + (b / kWindow) * a.dim + col;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] += part[v];
  }
  store_grad_row<T, V>(a, id, col, acc);
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  OpScope scope("topk", device_, detail::current_cuda_stream(device_));
  visit_numeric(x.dtype(), "topk", [&]<typename T>() {
    using K = order_key_t<T>;
    if (k <= 0 || values.numel() == 0) return;
    const int64_t n = x.size(-1);
    const int64_t n_rows = values.numel() / k;
    MICROLLM_CHECK(n < (int64_t{1} << 31) - 1, NotSupportedError, "topk", "rows of ", n,
                   " elements are too long for the CUDA kernel");
    Launch launch(values);
    const StridedMeta<1> meta = make_strided_meta<1>(rows::leading_shape(x), {rows::leading_strides(x)});
    const T* src = static_cast<const T*>(x.data_ptr());
    T* out_values = static_cast<T*>(values.data_ptr());
    auto* out_indices = static_cast<int64_t*>(indices.data_ptr());
    if (k <= kSortCap) {
      const int cap = static_cast<int>(std::min<int64_t>(kSortCap, rows::next_pow2(n)));
      const int threads = n > cap ? kSortThreads : std::clamp(cap / 2, 32, kSortThreads);
      const TopkArgs<T> args{src, meta,       n_rows,     static_cast<int>(n), x.stride(-1), static_cast<int>(k),
                             cap, out_values, out_indices};
      const size_t smem = static_cast<size_t>(cap) * (sizeof(K) + sizeof(uint32_t));
      topk_select_kernel<T>
          <<<static_cast<unsigned>(std::min<int64_t>(n_rows, kMaxBlocks)), threads, smem, launch.stream>>>(args);
      MICROLLM_CUDA_CHECK_LAUNCH();
      return;
    }
    // Large k: sort whole rows, a batch of rows at a time.
    const int64_t entry_bytes = static_cast<int64_t>(sizeof(K) + sizeof(uint32_t));
    const int64_t batch = std::clamp<int64_t>(kSortScratchBytes / (2 * n * entry_bytes), 1, n_rows);
    const Tensor scratch = Tensor::empty({2 * batch * n * entry_bytes}, DType::u8, values.device());
    auto* keys_a = static_cast<K*>(scratch.data_ptr());
    K* keys_b = keys_a + batch * n;
    auto* index_a = reinterpret_cast<uint32_t*>(keys_b + batch * n);
    uint32_t* index_b = index_a + batch * n;
    for (int64_t row0 = 0; row0 < n_rows; row0 += batch) {
      const int64_t count = std::min(batch, n_rows - row0);
      const TopkLoader<T> loader{src, meta, x.stride(-1), row0};
      const auto sorted = sort_rows<K>(loader, count, n, keys_a, index_a, keys_b, index_b, launch.stream);
      topk_gather_kernel<T><<<grid_for(count * k), kThreads, 0, launch.stream>>>(loader, sorted.second, count, n, k,
                                                                                 out_values, out_indices);
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::scatter_add(const Tensor& index, const Tensor& src, int dim, const Tensor& out) {
  OpScope scope("scatter_add", device_, detail::current_cuda_stream(device_));
  visit_numeric(src.dtype(), "scatter_add", [&]<typename T>() {
    const int64_t n_src = src.size(dim);
    if (src.numel() == 0 || n_src == 0) return;
    Launch launch(out);
    Shape line_shape = src.shape();
    line_shape[dim] = 1;
    const StridedMeta<3> meta = make_strided_meta<3>(line_shape, {out.strides(), src.strides(), index.strides()});
    const int64_t lines = src.numel() / n_src;
    scatter_add_kernel<T><<<grid_for(lines), kThreads, 0, launch.stream>>>(
        static_cast<const int64_t*>(index.data_ptr()), static_cast<const T*>(src.data_ptr()),
        static_cast<T*>(out.data_ptr()), meta, lines, n_src, out.size(dim), index.stride(dim), src.stride(dim),
        out.stride(dim), detail::cuda_error_word(device_));
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  OpScope scope("embedding", device_, detail::current_cuda_stream(device_));
  if (out.numel() == 0) return;
  rows::visit_index(ids.dtype(), "embedding", [&]<typename I>() {
    Launch launch(out);
    const int64_t count = ids.numel(), vocab = weight.size(0), dim = weight.size(1);
    const auto esize = static_cast<int64_t>(weight.element_size());
    const StridedMeta<1> ids_meta = make_strided_meta<1>(ids.shape(), {ids.strides()});
    const I* id_ptr = static_cast<const I*>(ids.data_ptr());
    uint64_t* error_word = detail::cuda_error_word(device_);
    constexpr int kWarpsPerBlock = kThreads / 32;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(count, kWarpsPerBlock), kMaxBlocks));
    const bool vectorized = weight.stride(1) == 1 && (weight.stride(0) * esize) % 16 == 0 && (dim * esize) % 16 == 0 &&
                            rows::aligned16(weight.data_ptr()) && rows::aligned16(out.data_ptr());
    auto run = [&]<typename U>(int64_t units_per_row, int64_t row_stride, int64_t unit_stride) {
      embedding_kernel<U, I><<<blocks, kThreads, 0, launch.stream>>>(
          static_cast<const U*>(weight.data_ptr()), row_stride, unit_stride, id_ptr, ids_meta, count, vocab,
          units_per_row, static_cast<U*>(out.data_ptr()), error_word);
      MICROLLM_CUDA_CHECK_LAUNCH();
    };
    if (vectorized) {
      run.template operator()<uint4>(dim * esize / 16, weight.stride(0) * esize / 16, 1);
      return;
    }
    switch (esize) {
      case 1: run.template operator()<uint8_t>(dim, weight.stride(0), weight.stride(1)); break;
      case 2: run.template operator()<uint16_t>(dim, weight.stride(0), weight.stride(1)); break;
      case 4: run.template operator()<uint32_t>(dim, weight.stride(0), weight.stride(1)); break;
      case 8: run.template operator()<uint64_t>(dim, weight.stride(0), weight.stride(1)); break;
      default: no_kernel("embedding", weight.dtype());
    }
  });
}

void CudaBackend::embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) {
  OpScope scope("embedding_backward", device_, detail::current_cuda_stream(device_));
  visit_float(grad_out.dtype(), "embedding_backward", [&]<typename T>() {
    using A = acc_t<T>;
    if (grad_weight.numel() == 0) return;
    Launch launch(grad_weight);
    zero_fill(grad_weight, launch.stream);
    const int64_t n = ids.numel(), vocab = grad_weight.size(0), dim = grad_weight.size(1);
    if (n == 0) return;
    MICROLLM_CHECK(n < (int64_t{1} << 31) && vocab < (int64_t{1} << 31), NotSupportedError, "embedding_backward", n,
                   " ids over a vocabulary of ", vocab, " are too many for the CUDA kernel");
    rows::visit_index(ids.dtype(), "embedding_backward", [&]<typename I>() {
      const int64_t windows = ceil_div(n, kWindow);
      // Scratch: two (key, position) buffers for the sort, then the lead and trail partial sums.
      const int64_t sort_bytes = 4 * n * static_cast<int64_t>(sizeof(uint32_t));
      const int64_t partial_bytes = 2 * windows * dim * static_cast<int64_t>(sizeof(A));
      const Tensor scratch =
          Tensor::empty({ceil_div(sort_bytes, 16) * 16 + partial_bytes}, DType::u8, grad_weight.device());
      auto* base = static_cast<unsigned char*>(scratch.data_ptr());
      auto* keys_a = reinterpret_cast<uint32_t*>(base);
      const EmbeddingLoader<I> loader{static_cast<const I*>(ids.data_ptr()), ids.stride(0), vocab,
                                      detail::cuda_error_word(device_)};
      const auto sorted =
          sort_rows<uint32_t>(loader, 1, n, keys_a, keys_a + n, keys_a + 2 * n, keys_a + 3 * n, launch.stream);
      auto* lead = reinterpret_cast<A*>(base + ceil_div(sort_bytes, 16) * 16);
      const BackwardArgs<T> args{static_cast<const T*>(grad_out.data_ptr()),
                                 grad_out.stride(0),
                                 grad_out.stride(1),
                                 sorted.first,
                                 sorted.second,
                                 n,
                                 vocab,
                                 dim,
                                 static_cast<T*>(grad_weight.data_ptr()),
                                 lead,
                                 lead + windows * dim};
      constexpr int V = kPack<T>;
      const auto esize = static_cast<int64_t>(sizeof(T));
      const bool vectorized = grad_out.stride(1) == 1 && (grad_out.stride(0) * esize) % 16 == 0 && dim % V == 0 &&
                              rows::aligned16(grad_out.data_ptr()) && rows::aligned16(grad_weight.data_ptr());
      auto run = [&]<int W>() {
        const int64_t groups = dim / W;
        const int threads = static_cast<int>(std::min<int64_t>(128, ceil_div(groups, 32) * 32));
        const dim3 grid(static_cast<unsigned>(windows), static_cast<unsigned>(ceil_div(groups, threads)));
        embedding_backward_windows<T, W><<<grid, threads, 0, launch.stream>>>(args);
        MICROLLM_CUDA_CHECK_LAUNCH();
        embedding_backward_long_ids<T, W><<<grid, threads, 0, launch.stream>>>(args);
        MICROLLM_CUDA_CHECK_LAUNCH();
      };
      if (vectorized)
        run.template operator()<V>();
      else
        run.template operator()<1>();
    });
  });
}

}  // namespace microllm
