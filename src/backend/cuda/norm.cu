// CUDA RMSNorm (optionally fused with the residual add) and its backward, with the CPU reference's
// roundings (Hugging Face's order): h = round(x + residual); y = round(w * round(h * rstd)), statistics in
// f32 (f64 for f64).
//
// Forward: a warp (short rows) or a block (long rows) per row; the row stays in registers between the
// sum of squares and the output, so each input is read once. Rows that are contiguous and 16-byte aligned
// move in 16-byte vectors; other layouts and very long rows take a two-pass kernel (a block per row) that
// reads the row twice.
// Backward: a block per chunk of rows computes grad_h row by row and sums g * h * rstd for its rows into
// a private [n] slice (shared memory, or global for very long rows); a second kernel adds the slices in
// a fixed order, so grad_weight is the same on every run, with no atomics.
#include <cmath>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rms_math.cuh"

namespace microllm {
namespace cuda_kernels {
namespace {

constexpr int kNormThreads = 256;
// rms_norm_cached's longest row in 16-byte packs (8 a thread of the block); longer rows take two passes.
constexpr int64_t kMaxCachedPacks = 8 * kNormThreads;

template <int N, typename T>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Group p of a row: elements [p * V, p * V + V) in one 16-byte load when V > 1 (the row is contiguous
// and aligned), else the single element p at `step`.
template <typename T, int V>
__device__ __forceinline__ void load_group(const T* row, int64_t step, int64_t p, acc_t<T> (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = to_acc(row[p * step]);
  } else {
    const Pack<V, T> pack = reinterpret_cast<const Pack<V, T>*>(row)[p];
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = to_acc(pack.v[v]);
  }
}

// Group p of a contiguous row, rounded to T.
template <typename T, int V>
__device__ __forceinline__ void store_group(T* row, int64_t p, const acc_t<T> (&in)[V]) {
  if constexpr (V == 1) {
    row[p] = from_acc<T>(in[0]);
  } else {
    Pack<V, T> pack;
#pragma unroll
    for (int v = 0; v < V; ++v) pack.v[v] = from_acc<T>(in[v]);
    reinterpret_cast<Pack<V, T>*>(row)[p] = pack;
  }
}

template <typename T>
struct ForwardArgs {
  const T* x;
  const T* residual;  // null: no residual
  const T* weight;
  const T* x_weight;    // sandwich_rms_norm: x normalized by it first (vectorized warp and block rows), or null
  T* out;               // [rows, n] contiguous
  T* h_out;             // [rows, n] contiguous, or null
  acc_t<T>* rstd;       // [rows], or null (QK-norm keeps none)
  StridedMeta<2> rows;  // row index -> offset of the row's first element in x and in residual
  int64_t n_rows, n;
  int64_t x_step, r_step, w_step;  // element steps along a row (1 on the vectorized paths)
  acc_t<T> eps;
};

// h for group p of a row: x, or x + residual rounded to T (it is that stored h that gets normalized).
template <typename T, int V>
__device__ __forceinline__ void load_h(const ForwardArgs<T>& args, const T* x_row, const T* r_row, int64_t p,
                                       acc_t<T> (&h)[V]) {
  load_group<T, V>(x_row, args.x_step, p, h);
  if (r_row) {
    acc_t<T> r[V];
    load_group<T, V>(r_row, args.r_step, p, r);
#pragma unroll
    for (int v = 0; v < V; ++v) h[v] = round_to<T>(h[v] + r[v]);
  }
}

// y for group p: round(w * round(h * rstd)).
template <typename T, int V>
__device__ __forceinline__ void store_y(const ForwardArgs<T>& args, int64_t row, int64_t p, const acc_t<T> (&h)[V],
                                        acc_t<T> rstd) {
  acc_t<T> w[V], y[V];
  load_group<T, V>(args.weight, args.w_step, p, w);
#pragma unroll
  for (int v = 0; v < V; ++v) y[v] = rms_scaled<T>(w[v], h[v], rstd);
  store_group<T, V>(args.out + row * args.n, p, y);
}

// One row of rms_norm_cached: thread `lane` of the row's TPR holds groups lane + q * TPR (q < P) in registers (the
// kernel's comment says why); w: the weight packs where kWeightFirst loaded them; scratch: the block row's sums.
template <typename T, int V, int P, int TPR, bool kWeightFirst>
__device__ __forceinline__ void normalize_row(const ForwardArgs<T>& args, int64_t row, int lane,
                                              const Pack<V, T> (&w)[kWeightFirst ? P : 1], acc_t<T>* scratch) {
  using A = acc_t<T>;
  const int64_t groups = args.n / V;
  int64_t off[2];
  args.rows.offsets(row, off);
  const T* x_row = args.x + off[0];
  const T* r_row = args.residual ? args.residual + off[1] : nullptr;
  // Every load of the row before any store: h_out may alias x as far as the compiler knows, so a store of h
  // between two loads would keep the next load behind it, one memory round trip per pack.
  Pack<V, T> h[P], r[P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int64_t p = lane + q * TPR;
    if (p < groups) {
      h[q] = reinterpret_cast<const Pack<V, T>*>(x_row)[p];
      if (r_row) r[q] = reinterpret_cast<const Pack<V, T>*>(r_row)[p];
    }
  }
  if (args.x_weight) {  // sandwich_rms_norm: x = rms_norm(x, x_weight) first, as an rms_norm of these rows sums it
    A x_sum_sq = 0;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      if (lane + q * TPR < groups) {
#pragma unroll
        for (int v = 0; v < V; ++v) x_sum_sq += to_acc(h[q].v[v]) * to_acc(h[q].v[v]);
      }
    }
    const A x_rstd = rms_rstd(TPR == 32 ? warp_sum(x_sum_sq) : block_sum(x_sum_sq, scratch), args.n, args.eps);
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int64_t p = lane + q * TPR;
      if (p < groups) {
        A w[V];
        load_group<T, V>(args.x_weight, 1, p, w);
#pragma unroll
        for (int v = 0; v < V; ++v) h[q].v[v] = from_acc<T>(rms_scaled<T>(w[v], to_acc(h[q].v[v]), x_rstd));
      }
    }
  }
  A sum_sq = 0;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int64_t p = lane + q * TPR;
    if (p < groups) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        // h = x, or round(x + residual): a value of T either way, so keeping T is exact.
        const A value = r_row ? round_to<T>(to_acc(h[q].v[v]) + to_acc(r[q].v[v])) : to_acc(h[q].v[v]);
        sum_sq += value * value;
        h[q].v[v] = from_acc<T>(value);
      }
      if (args.h_out) reinterpret_cast<Pack<V, T>*>(args.h_out + row * args.n)[p] = h[q];
    }
  }
  A total;
  if constexpr (TPR == 32)
    total = warp_sum(sum_sq);
  else
    total = block_sum(sum_sq, scratch);
  const A rstd = rms_rstd(total, args.n, args.eps);
  if (lane == 0 && args.rstd) args.rstd[row] = rstd;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int64_t p = lane + q * TPR;
    if (p < groups) {
      A values[V];
#pragma unroll
      for (int v = 0; v < V; ++v) values[v] = to_acc(h[q].v[v]);
      if constexpr (kWeightFirst) {
        A y[V];
#pragma unroll
        for (int v = 0; v < V; ++v) y[v] = rms_scaled<T>(to_acc(w[q].v[v]), values[v], rstd);
        store_group<T, V>(args.out + row * args.n, p, y);
      } else {
        store_y<T, V>(args, row, p, values, rstd);
      }
    }
  }
}

// TPR threads per row (32: a warp, 256: the block); thread `lane` holds groups lane + q * TPR, q < P, of
// its row in registers, as raw T packs (h is x, or round(x + residual): a value of T either way, so
// keeping T instead of f32 is exact and halves the registers of bf16 rows, which lets a warp own rows of
// up to 16 packs per lane without block barriers). Needs 0 < n / V <= P * TPR.
// kWeightFirst (warp rows only): the weight is loaded into registers before the wait, see below.
// Warp rows keep to 128 registers, two blocks an SM, except long rows holding their weight (a decode step's
// few rows, which one block an SM covers): a prefill's many rows at one block an SM run in waves at low occupancy
// (docs/perf/kernels.md#norm). (bf16 P 4 spills 4 bytes at the cap, P 8 72: ptxas, CUDA 13.0.)
template <typename T, int V, int P, int TPR, bool kWeightFirst>
__global__ void __launch_bounds__(kNormThreads, TPR == 32 && (P <= 4 || !kWeightFirst) ? 2 : 1)
    rms_norm_cached(const ForwardArgs<T> args) {
  using A = acc_t<T>;
  static_assert(TPR == 32 || TPR == kNormThreads, "a row is a warp or the block");
  static_assert(TPR == 32 || !kWeightFirst, "a block row loads its weight after its barrier");
  constexpr int kRowsPerBlock = kNormThreads / TPR;
  __shared__ A scratch[32];
  const int lane = threadIdx.x % TPR;
  const int64_t groups = args.n / V;
  // A warp row holds the weight (the same for every row) in registers, loaded before anything else: before
  // the row's loads and reduction and, launched chained in a decode graph, before the kernel before has even
  // finished (no kernel of a decode step writes a weight). The block row loads it after its barrier (earlier
  // loads hold more registers across the barrier and stream slower). Long warp rows of many-row calls (a
  // prefill) load it at the store too: registers for two blocks an SM.
  Pack<V, T> w[kWeightFirst ? P : 1];
  if constexpr (kWeightFirst) {
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int64_t p = lane + q * TPR;
      if (p < groups) w[q] = reinterpret_cast<const Pack<V, T>*>(args.weight)[p];
    }
  }
  wait_for_prior_grids();  // x and the residual come from the kernel before
  chain_next_grids();
  // Uniform per row group: every thread of a warp (TPR 32) or of the block (TPR 256) runs the same rows.
  for (int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / TPR; row < args.n_rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    normalize_row<T, V, P, TPR, kWeightFirst>(args, row, lane, w, scratch);
  }
}

// QK-norm's two RMSNorms in one launch (CudaFusions::qk_rms_norm): a warp a row of at most 32 packs (a head of
// D <= 256 in bf16), the rows of q and then those of k, each with its own weight; rms_norm's warp rows, so its
// bits. A decode step's q and k are a few rows each: two launches cost more than the work.
template <typename T, int V>
__global__ void __launch_bounds__(kNormThreads) qk_rms_norm_rows(const ForwardArgs<T> q, const ForwardArgs<T> k) {
  wait_for_prior_grids();  // q and k come from the qkv projection just before
  chain_next_grids();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = blockIdx.x * int64_t{kNormThreads / 32} + threadIdx.x / 32;
  const Pack<V, T> no_weight[1] = {};  // normalize_row loads the weight at its store
  if (row < q.n_rows) {
    normalize_row<T, V, 1, 32, false>(q, row, lane, no_weight, nullptr);
  } else if (row < q.n_rows + k.n_rows) {
    normalize_row<T, V, 1, 32, false>(k, row - q.n_rows, lane, no_weight, nullptr);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kNormThreads) rms_norm_two_pass(const ForwardArgs<T> args) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t groups = args.n / V;
  for (int64_t row = blockIdx.x; row < args.n_rows; row += gridDim.x) {
    int64_t off[2];
    args.rows.offsets(row, off);
    const T* x_row = args.x + off[0];
    const T* r_row = args.residual ? args.residual + off[1] : nullptr;
    A sum_sq = 0;
    for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
      A h[V];
      load_h<T, V>(args, x_row, r_row, p, h);
#pragma unroll
      for (int v = 0; v < V; ++v) sum_sq += h[v] * h[v];
      if (args.h_out) store_group<T, V>(args.h_out + row * args.n, p, h);
    }
    const A total = block_sum(sum_sq, scratch);
    const A mean_sq = args.n > 0 ? total / static_cast<A>(args.n) : A(0);
    const A rstd = A(1) / std::sqrt(mean_sq + args.eps);
    if (threadIdx.x == 0) args.rstd[row] = rstd;
    for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
      A h[V];
      load_h<T, V>(args, x_row, r_row, p, h);
      store_y<T, V>(args, row, p, h, rstd);
    }
  }
}

template <typename T>
struct BackwardArgs {
  const T* grad_out;
  const T* h;
  const T* weight;
  const acc_t<T>* rstd;
  int64_t rstd_step;
  T* grad_h;            // [rows, n] contiguous
  acc_t<T>* partials;   // [chunks, n]: chunk c's sum over its rows of g * h * rstd
  StridedMeta<2> rows;  // row index -> offset of the row's first element in grad_out and in h
  int64_t n_rows, n, rows_per_chunk;
  int64_t g_step, h_step, w_step;
  bool shared_partials;  // accumulate in shared memory (n * sizeof(A) bytes), else in the chunk's global slice
};

// grad_h = rstd * (w g - h * rstd^2 * mean(w g h)) per row; block b owns rows [b * rpc, (b + 1) * rpc) and
// column sums partials[b, :]. Each column has one owner thread (groups p = tid + i * blockDim), so the
// accumulation needs no synchronization. Needs n > 0.
template <typename T, int V>
__global__ void __launch_bounds__(kNormThreads) rms_norm_backward_rows(const BackwardArgs<T> args) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  __shared__ A scratch[32];
  const int64_t groups = args.n / V;
  A* acc = args.shared_partials ? reinterpret_cast<A*>(shared_raw) : args.partials + blockIdx.x * args.n;
  for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
#pragma unroll
    for (int v = 0; v < V; ++v) acc[p * V + v] = A(0);
  }
  const int64_t begin = blockIdx.x * args.rows_per_chunk;
  const int64_t end = min(args.n_rows, begin + args.rows_per_chunk);
  for (int64_t row = begin; row < end; ++row) {  // uniform across the block
    int64_t off[2];
    args.rows.offsets(row, off);
    const T* g_row = args.grad_out + off[0];
    const T* h_row = args.h + off[1];
    const A r = args.rstd[row * args.rstd_step];
    A dot = 0;  // sum(w g h)
    for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
      A g[V], h[V], w[V];
      load_group<T, V>(g_row, args.g_step, p, g);
      load_group<T, V>(h_row, args.h_step, p, h);
      load_group<T, V>(args.weight, args.w_step, p, w);
#pragma unroll
      for (int v = 0; v < V; ++v) dot += w[v] * g[v] * h[v];
    }
    dot = block_sum(dot, scratch);
    const A c = r * r * dot / static_cast<A>(args.n);
    for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
      A g[V], h[V], w[V], dh[V];
      load_group<T, V>(g_row, args.g_step, p, g);
      load_group<T, V>(h_row, args.h_step, p, h);
      load_group<T, V>(args.weight, args.w_step, p, w);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        dh[v] = r * (w[v] * g[v] - h[v] * c);
        acc[p * V + v] += g[v] * h[v] * r;
      }
      store_group<T, V>(args.grad_h + row * args.n, p, dh);
    }
  }
  if (args.shared_partials) {
    A* slice = args.partials + blockIdx.x * args.n;
    for (int64_t p = threadIdx.x; p < groups; p += blockDim.x) {
#pragma unroll
      for (int v = 0; v < V; ++v) slice[p * V + v] = acc[p * V + v];
    }
  }
}

// grad_weight[j] = sum over chunks of partials[c, j], in a fixed order. Block (32, 8): x picks the column
// (coalesced), y a strided subset of the chunks; the 8 subtotals are then added in order.
template <typename T>
__global__ void rms_norm_weight_grad(const acc_t<T>* __restrict__ partials, int64_t chunks, int64_t n,
                                     T* __restrict__ grad_weight) {
  using A = acc_t<T>;
  __shared__ A subtotal[8][33];
  for (int64_t base = blockIdx.x * 32; base < n; base += static_cast<int64_t>(gridDim.x) * 32) {  // uniform
    const int64_t j = base + threadIdx.x;
    A s = 0;
    if (j < n) {
      for (int64_t c = threadIdx.y; c < chunks; c += 8) s += partials[c * n + j];
    }
    subtotal[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
      A total = 0;
#pragma unroll
      for (int y = 0; y < 8; ++y) total += subtotal[y][threadIdx.x];
      grad_weight[j] = from_acc<T>(total);
    }
    __syncthreads();  // subtotal is rewritten by the next column tile
  }
}

// ---- host side ----

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The dims before the last of a and b (same sizes), merged: row index -> first element of the row.
StridedMeta<2> row_meta(const Tensor& a, const Tensor& b) {
  Shape lead;
  Strides sa, sb;
  for (int d = 0; d + 1 < a.dim(); ++d) {
    lead.push_back(a.size(d));
    sa.push_back(a.stride(d));
    sb.push_back(b.stride(d));
  }
  return make_strided_meta<2>(lead, {sa, sb});
}

// Every row start lies on a 16-byte boundary when the base does (the row strides are multiples of 16 bytes).
bool row_strides_aligned(const StridedMeta<2>& meta, size_t element_size) {
  for (int d = 0; d < meta.rank; ++d) {
    if (meta.shape[d] == 1) continue;
    for (int k = 0; k < 2; ++k) {
      if ((meta.strides[k][d] * static_cast<int64_t>(element_size)) % 16 != 0) return false;
    }
  }
  return true;
}

// Whether the rows of `args` (its steps set from the tensors' strides) move in 16-byte packs: unit steps, whole packs
// a row, every row and vector aligned.
// The forward's arguments from its tensors: n_rows rows of x's last dim; residual, h_out and rstd may be undefined.
template <typename T>
ForwardArgs<T> forward_args(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                            const Tensor& out, const Tensor& h_out, const Tensor& rstd, int64_t n_rows) {
  const bool fused = residual.defined();
  ForwardArgs<T> args{};
  args.x = static_cast<const T*>(x.data_ptr());
  args.residual = fused ? static_cast<const T*>(residual.data_ptr()) : nullptr;
  args.weight = static_cast<const T*>(weight.data_ptr());
  args.out = static_cast<T*>(out.data_ptr());
  args.h_out = h_out.defined() ? static_cast<T*>(h_out.data_ptr()) : nullptr;
  args.rstd = rstd.defined() ? static_cast<acc_t<T>*>(rstd.data_ptr()) : nullptr;
  args.rows = row_meta(x, fused ? residual : x);
  args.n_rows = n_rows;
  args.n = x.size(-1);
  args.x_step = x.stride(-1);
  args.r_step = fused ? residual.stride(-1) : 0;
  args.w_step = weight.stride(0);
  args.eps = static_cast<acc_t<T>>(eps);  // HF adds eps to an f32 tensor
  return args;
}

template <typename T>
bool vector_rows(const ForwardArgs<T>& a) {
  constexpr int V = 16 / sizeof(T);
  const bool fused = a.residual != nullptr;
  return a.n > 0 && a.n % V == 0 && a.x_step == 1 && (!fused || a.r_step == 1) && a.w_step == 1 && aligned16(a.x) &&
         (!fused || aligned16(a.residual)) && aligned16(a.weight) && aligned16(a.out) &&
         (!a.h_out || aligned16(a.h_out)) && row_strides_aligned(a.rows, sizeof(T));
}

template <typename T, int V, int P, int TPR, bool kWeightFirst = false>
void launch_cached(const ForwardArgs<T>& args, cudaStream_t stream, int device) {
  launch_chained(rms_norm_cached<T, V, P, TPR, kWeightFirst>, grid_for(args.n_rows, kNormThreads / TPR), kNormThreads,
                 0, stream, device, args);
}

// A warp per row. Rows of up to 4 packs a lane always hold their weight; longer ones only when one block an SM
// covers the rows (a decode step's), since holding it costs the second block an SM that a prefill's rows need.
template <typename T, int V, int P>
void launch_warp_rows(const ForwardArgs<T>& args, cudaStream_t stream, int device) {
  constexpr int kRowsPerBlock = kNormThreads / 32;
  if constexpr (P <= 4) {
    launch_cached<T, V, P, 32, true>(args, stream, device);
  } else if (args.n_rows <= int64_t{kRowsPerBlock} * multiprocessor_count(device)) {
    launch_cached<T, V, P, 32, true>(args, stream, device);
  } else {
    launch_cached<T, V, P, 32, false>(args, stream, device);
  }
}

template <typename T>
void launch_forward(ForwardArgs<T> args, bool vectorized, cudaStream_t stream, int device) {
  constexpr int V = 16 / sizeof(T);
  if (vectorized) {
    args.x_step = args.r_step = args.w_step = 1;
    const int64_t groups = args.n / V;
    // A warp per row up to 8 packs per lane (the models' hidden sizes: bf16 rows up to 2048), 8 rows per
    // block, no block barriers; longer rows take the block (a warp of 16 packs a lane leaves too few warps in
    // flight per SM; docs/perf/kernels.md#norm).
    if (groups <= 32) return launch_warp_rows<T, V, 1>(args, stream, device);
    if (groups <= 64) return launch_warp_rows<T, V, 2>(args, stream, device);
    if (groups <= 128) return launch_warp_rows<T, V, 4>(args, stream, device);
    if (groups <= 192) return launch_warp_rows<T, V, 6>(args, stream, device);  // R1-Distill-1.5B: 1536
    if (groups <= 256) return launch_warp_rows<T, V, 8>(args, stream, device);
    // Rows of 257..2048 packs: the block of 256 threads per row (fewer threads a row stream slower).
    if (groups <= 512) return launch_cached<T, V, 2, 256>(args, stream, device);
    if (groups <= 1024) return launch_cached<T, V, 4, 256>(args, stream, device);
    if (groups <= kMaxCachedPacks) return launch_cached<T, V, 8, 256>(args, stream, device);
    rms_norm_two_pass<T, V><<<grid_for(args.n_rows, 1), kNormThreads, 0, stream>>>(args);
  } else {
    rms_norm_two_pass<T, 1><<<grid_for(args.n_rows, 1), kNormThreads, 0, stream>>>(args);
  }
}

constexpr int64_t kMaxChunks = 1024;
constexpr int64_t kMinRowsPerChunk = 8;
constexpr size_t kMaxSharedPartialBytes = 40 * 1024;  // under the 48 KiB default, with room for scratch

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& out,
                           const Tensor& h_out, const Tensor& rstd_out) {
  OpScope scope("rms_norm", device_, detail::current_cuda_stream(device_));
  visit_float(x.dtype(), "rms_norm", [&]<typename T>() {
    using A = acc_t<T>;
    const int64_t rows = rstd_out.numel();
    MICROLLM_CHECK(rstd_out.dtype() == (std::is_same_v<A, double> ? DType::f64 : DType::f32), DTypeError, "rms_norm",
                   "rstd must be ", (std::is_same_v<A, double> ? "f64" : "f32"), ", got ", rstd_out.dtype());
    if (rows == 0) return;
    Launch launch(out);
    const ForwardArgs<T> args = forward_args<T>(x, residual, weight, eps, out, h_out, rstd_out, rows);
    launch_forward<T>(args, vector_rows(args), launch.stream, launch.device);
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

// One kernel where rms_norm would run x's rows as vectorized warp or block rows (rms_norm_cached: up to 2,048 packs a
// row), whose lanes then sum x's squares for its own norm as an rms_norm of x would; else the two rms_norms.
void CudaFusions::sandwich_rms_norm(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                    const Tensor& norm_weight, double eps, const Tensor& out, const Tensor& h_out,
                                    const Tensor& rstd) {
  bool launched = false;
  visit_float(x.dtype(), "sandwich_rms_norm", [&]<typename T>() {
    constexpr int V = 16 / sizeof(T);
    const int64_t rows = rstd.numel();
    if (rows == 0) return;
    ForwardArgs<T> args = forward_args<T>(x, residual, norm_weight, eps, out, h_out, rstd, rows);
    args.x_weight = static_cast<const T*>(x_norm_weight.data_ptr());
    if (!vector_rows(args) || x_norm_weight.stride(0) != 1 || !aligned16(args.x_weight) || args.n / V > kMaxCachedPacks) return;
    OpScope scope("sandwich_rms_norm", device_, detail::current_cuda_stream(device_));
    Launch launch(out);
    launch_forward<T>(args, /*vectorized=*/true, launch.stream, launch.device);
    MICROLLM_CUDA_CHECK_LAUNCH();
    launched = true;
  });
  if (!launched) Fusions::sandwich_rms_norm(x, x_norm_weight, residual, norm_weight, eps, out, h_out, rstd);
}

// One kernel for both where each is rows of at most 32 16-byte packs that rms_norm would vectorize; else the
// composition (two rms_norm launches).
void CudaFusions::qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                              double eps, const Tensor& q_out, const Tensor& k_out) {
  bool launched = false;
  visit_float(q.dtype(), "qk_rms_norm", [&]<typename T>() {
    using A = acc_t<T>;
    constexpr int V = 16 / sizeof(T);
    const int64_t n = q.size(-1);
    if constexpr (std::is_same_v<A, float>) {
      if (n / V > 32 || q.numel() == 0 || k.numel() == 0) return;
      auto args_of = [&](const Tensor& x, const Tensor& w, const Tensor& out) {
        return forward_args<T>(x, Tensor(), w, eps, out, Tensor(), Tensor(), x.numel() / n);
      };
      const ForwardArgs<T> qa = args_of(q, q_weight, q_out), ka = args_of(k, k_weight, k_out);
      if (!vector_rows(qa) || !vector_rows(ka)) return;
      OpScope scope("qk_rms_norm", device_, detail::current_cuda_stream(device_));
      Launch launch(q_out);
      launch_chained(qk_rms_norm_rows<T, V>, grid_for(qa.n_rows + ka.n_rows, kNormThreads / 32), kNormThreads, 0,
                     launch.stream, launch.device, qa, ka);
      MICROLLM_CUDA_CHECK_LAUNCH();
      launched = true;
    }
  });
  if (!launched) Fusions::qk_rms_norm(q, k, q_weight, k_weight, eps, q_out, k_out);
}

void CudaBackend::rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                                    const Tensor& grad_h, const Tensor& grad_weight) {
  OpScope scope("rms_norm_backward", device_, detail::current_cuda_stream(device_));
  visit_float(h.dtype(), "rms_norm_backward", [&]<typename T>() {
    using A = acc_t<T>;
    constexpr DType kStats = std::is_same_v<A, double> ? DType::f64 : DType::f32;
    const int64_t n = h.size(-1), rows = rstd.numel();
    MICROLLM_CHECK(rstd.dtype() == kStats, DTypeError, "rms_norm_backward", "rstd must be ", kStats, ", got ",
                   rstd.dtype());
    if (n == 0) return;  // grad_h and grad_weight are empty
    Launch launch(grad_weight);
    // Chunks of at least kMinRowsPerChunk rows, at most kMaxChunks of them: enough blocks to fill the GPU,
    // few enough partial rows that summing them costs little next to reading g and h.
    const int64_t rows_per_chunk = std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    Tensor partials = Tensor::empty({std::max<int64_t>(chunks, 1), n}, kStats, grad_weight.device());
    A* partial_data = static_cast<A*>(partials.data_ptr());
    if (rows > 0) {
      BackwardArgs<T> args{};
      args.grad_out = static_cast<const T*>(grad_out.data_ptr());
      args.h = static_cast<const T*>(h.data_ptr());
      args.weight = static_cast<const T*>(weight.data_ptr());
      args.rstd = static_cast<const A*>(rstd.data_ptr());
      args.rstd_step = rstd.stride(0);
      args.grad_h = static_cast<T*>(grad_h.data_ptr());
      args.partials = partial_data;
      args.rows = row_meta(grad_out, h);
      args.n_rows = rows;
      args.n = n;
      args.rows_per_chunk = rows_per_chunk;
      args.g_step = grad_out.stride(-1);
      args.h_step = h.stride(-1);
      args.w_step = weight.stride(0);
      const size_t shared_bytes = static_cast<size_t>(n) * sizeof(A);
      args.shared_partials = shared_bytes <= kMaxSharedPartialBytes;
      const size_t dynamic_shared = args.shared_partials ? shared_bytes : 0;
      constexpr int V = 16 / sizeof(T);
      const bool vectorized = n % V == 0 && args.g_step == 1 && args.h_step == 1 && args.w_step == 1 &&
                              aligned16(args.grad_out) && aligned16(args.h) && aligned16(args.weight) &&
                              aligned16(args.grad_h) && row_strides_aligned(args.rows, sizeof(T));
      const auto blocks = static_cast<unsigned>(chunks);
      if (vectorized) {
        args.g_step = args.h_step = args.w_step = 1;
        rms_norm_backward_rows<T, V><<<blocks, kNormThreads, dynamic_shared, launch.stream>>>(args);
      } else {
        rms_norm_backward_rows<T, 1><<<blocks, kNormThreads, dynamic_shared, launch.stream>>>(args);
      }
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
    const dim3 block(32, 8);
    const unsigned blocks = grid_for(n, 32);
    rms_norm_weight_grad<T><<<blocks, block, 0, launch.stream>>>(partial_data, rows > 0 ? chunks : 0, n,
                                                                 static_cast<T*>(grad_weight.data_ptr()));
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace microllm
