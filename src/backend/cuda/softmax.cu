// CUDA softmax and log-softmax over the last dim, and their backward from the forward's output y.
//
// A warp per row for rows of up to kWarpRowLimit elements, a block per row above. Pass 1 keeps an
// online (max, sum of exp) per thread, combined over the warp or block; pass 2 reads the row again and
// writes the output (rows are read twice, the second time mostly from L2). Rows that are unit-stride
// and 16-byte aligned move in 16-byte packs; any other layout (a transposed view) takes strided loads.
// A row of only -inf gives NaN, as on the CPU. Statistics in f32 (f64 for f64).
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels {
namespace {

using rows::kPack;
using rows::leading_shape;
using rows::leading_strides;
using rows::Pack;

constexpr int64_t kWarpRowLimit = 1024;  // longer rows take a block each
constexpr int kWarpKernelThreads = 256;  // 8 rows (warps) per block
// The block kernel's largest block: 1024 threads on very long rows (256 for f64, whose registers would
// not fit 1024 threads without spilling).
template <typename T>
constexpr int kMaxThreads = std::is_same_v<T, double> ? 256 : 1024;
constexpr unsigned kMaxBlocks = 1u << 20;

// The threads that share a row: a warp (kBlock false) or the whole block.
template <bool kBlock>
struct RowGroup {
  __device__ static int tid() { return kBlock ? threadIdx.x : threadIdx.x % 32; }
  __device__ static int size() { return kBlock ? blockDim.x : 32; }
  __device__ static int64_t first() {
    return kBlock ? blockIdx.x : blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  }
  __device__ static int64_t count() { return kBlock ? gridDim.x : static_cast<int64_t>(gridDim.x) * (blockDim.x / 32); }
  template <typename A>
  __device__ static A sum(A v, A* scratch) {
    if constexpr (kBlock)
      return block_sum(v, scratch);
    else
      return warp_sum(v);
  }
  template <typename A>
  __device__ static rows::OnlineStats<A> combine(rows::OnlineStats<A> s, A* scratch) {
    if constexpr (kBlock)
      return rows::block_combine(s, scratch);
    else
      return rows::warp_combine(s);
  }
};

// x: rows at offsets rows_meta(r), elements `step` apart; out: [rows, n] contiguous.
template <typename T, bool kLog, bool kBlock>
__global__ void __launch_bounds__(kBlock ? kMaxThreads<T> : kWarpKernelThreads, kBlock ? 1 : 2)
    softmax_kernel(const T* __restrict__ x, T* __restrict__ out, StridedMeta<1> rows_meta, int64_t n_rows, int64_t n,
                   int64_t step) {
  using A = acc_t<T>;
  using G = RowGroup<kBlock>;
  constexpr int V = kPack<T>;
  __shared__ A scratch[32];
  for (int64_t r = G::first(); r < n_rows; r += G::count()) {
    int64_t off[1];
    rows_meta.offsets(r, off);
    const T* row = x + off[0];
    rows::OnlineStats<A> stats;
    rows::visit_row(row, n, step, G::tid(), G::size(), [&](int64_t, const T* v, int count) { stats.add(v, count); });
    stats = G::combine(stats, scratch);
    const A inv_sum = A(1) / stats.sum;
    const A log_sum = rows::acc_log(stats.sum);
    T* o = out + r * n;
    const bool out_aligned = rows::aligned16(o);
    rows::visit_row(row, n, step, G::tid(), G::size(), [&](int64_t i, const T* v, int count) {
      Pack<V, T> result;
#pragma unroll
      for (int j = 0; j < V && j < count; ++j) {
        const A shifted = to_acc(v[j]) - stats.max;
        result.v[j] = from_acc<T>(kLog ? shifted - log_sum : rows::fast_exp(shifted) * inv_sum);
      }
      if (count == V && out_aligned) {
        *reinterpret_cast<Pack<V, T>*>(o + i) = result;
      } else {
#pragma unroll
        for (int j = 0; j < V && j < count; ++j) o[i + j] = result.v[j];
      }
    });
  }
}

// The forward for contiguous, aligned rows of kWarpRowLimit < n <= P * 256 * V elements: a block per row
// holds its row in registers (P packs per thread), so the row is read once instead of twice.
constexpr int kCachedThreads = 256;
template <typename T, bool kLog, int P>
__global__ void __launch_bounds__(kCachedThreads) softmax_cached_kernel(const T* __restrict__ x, T* __restrict__ out,
                                                                          StridedMeta<1> rows_meta, int64_t n_rows,
                                                                          int64_t n) {
  using A = acc_t<T>;
  constexpr int V = kPack<T>;
  __shared__ A scratch[32];
  const int64_t groups = n / V;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    int64_t off[1];
    rows_meta.offsets(r, off);
    const auto* row = reinterpret_cast<const Pack<V, T>*>(x + off[0]);
    A v[P][V];
    A local_max = -INFINITY;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int64_t p = threadIdx.x + q * kCachedThreads;
      if (p < groups) {
        const Pack<V, T> pack = row[p];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          v[q][j] = to_acc(pack.v[j]);
          local_max = max(local_max, v[q][j]);
        }
      }
    }
    const A row_max = block_max(local_max, scratch);
    A local_sum = 0;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      if (threadIdx.x + q * kCachedThreads < groups) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          v[q][j] -= row_max;  // a row of only -inf gives NaN here, as on the CPU
          local_sum += rows::fast_exp(v[q][j]);
        }
      }
    }
    const A sum = block_sum(local_sum, scratch);
    const A inv_sum = A(1) / sum;
    const A log_sum = rows::acc_log(sum);
    auto* o = reinterpret_cast<Pack<V, T>*>(out + r * n);
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int64_t p = threadIdx.x + q * kCachedThreads;
      if (p < groups) {
        Pack<V, T> result;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          result.v[j] = from_acc<T>(kLog ? v[q][j] - log_sum : rows::fast_exp(v[q][j]) * inv_sum);
        }
        o[p] = result;
      }
    }
  }
}

// Calls fn(index, y_values, g_values, count) over the row elements a thread owns: packs when both rows
// are unit-stride and aligned, single elements otherwise.
template <typename T, typename Fn>
__device__ __forceinline__ void visit_two_rows(const T* y, int64_t y_step, const T* g, int64_t g_step, int64_t n,
                                               int tid, int nthreads, Fn&& fn) {
  constexpr int V = kPack<T>;
  if (V > 1 && y_step == 1 && g_step == 1 && rows::aligned16(y) && rows::aligned16(g)) {
    const int64_t np = n / V;
    for (int64_t p = tid; p < np; p += nthreads) {
      const Pack<V, T> yp = reinterpret_cast<const Pack<V, T>*>(y)[p];
      const Pack<V, T> gp = reinterpret_cast<const Pack<V, T>*>(g)[p];
      fn(p * V, yp.v, gp.v, V);
    }
    for (int64_t i = np * V + tid; i < n; i += nthreads) {
      const T yv = y[i], gv = g[i];
      fn(i, &yv, &gv, 1);
    }
  } else {
    for (int64_t i = tid; i < n; i += nthreads) {
      const T yv = y[i * y_step], gv = g[i * g_step];
      fn(i, &yv, &gv, 1);
    }
  }
}

// softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g). dx: [rows, n] contiguous.
template <typename T, bool kLog, bool kBlock>
__global__ void __launch_bounds__(kBlock ? kMaxThreads<T> : kWarpKernelThreads, kBlock ? 1 : 2)
    softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx,
                            StridedMeta<2> rows_meta, int64_t n_rows, int64_t n, int64_t y_step, int64_t g_step) {
  using A = acc_t<T>;
  using G = RowGroup<kBlock>;
  constexpr int V = kPack<T>;
  __shared__ A scratch[32];
  for (int64_t r = G::first(); r < n_rows; r += G::count()) {
    int64_t off[2];
    rows_meta.offsets(r, off);
    const T* yr = y + off[0];
    const T* gr = g + off[1];
    A partial = 0;
    visit_two_rows(yr, y_step, gr, g_step, n, G::tid(), G::size(), [&](int64_t, const T* yv, const T* gv, int count) {
#pragma unroll
      for (int j = 0; j < V && j < count; ++j) partial += kLog ? to_acc(gv[j]) : to_acc(gv[j]) * to_acc(yv[j]);
    });
    const A sum = G::sum(partial, scratch);
    T* o = dx + r * n;
    const bool out_aligned = rows::aligned16(o);
    visit_two_rows(yr, y_step, gr, g_step, n, G::tid(), G::size(), [&](int64_t i, const T* yv, const T* gv, int count) {
      Pack<V, T> result;
#pragma unroll
      for (int j = 0; j < V && j < count; ++j) {
        const A yj = to_acc(yv[j]), gj = to_acc(gv[j]);
        // The accurate exp: y is a log-probability, exp(y) is the probability itself.
        result.v[j] = from_acc<T>(kLog ? gj - exp(yj) * sum : yj * (gj - sum));
      }
      if (count == V && out_aligned) {
        *reinterpret_cast<Pack<V, T>*>(o + i) = result;
      } else {
#pragma unroll
        for (int j = 0; j < V && j < count; ++j) o[i + j] = result.v[j];
      }
    });
  }
}

// Launches kernel<kBlock> over n_rows rows of n: warps for short rows, blocks for long ones.
template <typename T, typename Launcher>
void launch_rows(int64_t n_rows, int64_t n, Launcher&& launcher) {
  if (n <= kWarpRowLimit) {
    const int64_t blocks = (n_rows + kWarpKernelThreads / 32 - 1) / (kWarpKernelThreads / 32);
    launcher.template operator()<false>(static_cast<unsigned>(std::min<int64_t>(blocks, kMaxBlocks)),
                                        kWarpKernelThreads);
  } else {
    const int threads = n >= 32768 ? kMaxThreads<T> : 256;
    launcher.template operator()<true>(static_cast<unsigned>(std::min<int64_t>(n_rows, kMaxBlocks)), threads);
  }
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::softmax(const Tensor& x, bool log, const Tensor& out) {
  const char* name = log ? "log_softmax" : "softmax";
  OpScope scope(name, device_, detail::current_cuda_stream(device_));
  visit_float(x.dtype(), name, [&]<typename T>() {
    if (x.numel() == 0) return;
    Launch launch(out);
    const int64_t n = x.size(-1);
    const int64_t n_rows = x.numel() / n;
    const StridedMeta<1> meta = make_strided_meta<1>(leading_shape(x), {leading_strides(x)});
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    const int64_t step = x.stride(-1);
    // Rows in registers when they are contiguous, 16-byte aligned and fit 4 packs per thread.
    constexpr int V = kPack<T>;
    bool rows_aligned = step == 1 && n % V == 0 && rows::aligned16(src) && rows::aligned16(dst);
    for (int d = 0; d < meta.rank; ++d) rows_aligned = rows_aligned && (meta.strides[0][d] * sizeof(T)) % 16 == 0;
    if (V > 1 && rows_aligned && n > kWarpRowLimit && n <= 4 * kCachedThreads * V) {
      const auto blocks = static_cast<unsigned>(std::min<int64_t>(n_rows, kMaxBlocks));
      auto launch_cached = [&]<int P>() {
        if (log) {
          softmax_cached_kernel<T, true, P><<<blocks, kCachedThreads, 0, launch.stream>>>(src, dst, meta, n_rows, n);
        } else {
          softmax_cached_kernel<T, false, P><<<blocks, kCachedThreads, 0, launch.stream>>>(src, dst, meta, n_rows, n);
        }
      };
      if (n <= 2 * kCachedThreads * V) launch_cached.template operator()<2>();
      else launch_cached.template operator()<4>();
      MICROLLM_CUDA_CHECK_LAUNCH();
      return;
    }
    launch_rows<T>(n_rows, n, [&]<bool kBlock>(unsigned blocks, int threads) {
      if (log) {
        softmax_kernel<T, true, kBlock><<<blocks, threads, 0, launch.stream>>>(src, dst, meta, n_rows, n, step);
      } else {
        softmax_kernel<T, false, kBlock><<<blocks, threads, 0, launch.stream>>>(src, dst, meta, n_rows, n, step);
      }
      MICROLLM_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& grad_out, bool log, const Tensor& grad_x) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  OpScope scope(name, device_, detail::current_cuda_stream(device_));
  visit_float(y.dtype(), name, [&]<typename T>() {
    if (y.numel() == 0) return;
    Launch launch(grad_x);
    const int64_t n = y.size(-1);
    const int64_t n_rows = y.numel() / n;
    const StridedMeta<2> meta = make_strided_meta<2>(leading_shape(y), {leading_strides(y), leading_strides(grad_out)});
    const T* ys = static_cast<const T*>(y.data_ptr());
    const T* gs = static_cast<const T*>(grad_out.data_ptr());
    T* dst = static_cast<T*>(grad_x.data_ptr());
    const int64_t y_step = y.stride(-1), g_step = grad_out.stride(-1);
    launch_rows<T>(n_rows, n, [&]<bool kBlock>(unsigned blocks, int threads) {
      if (log) {
        softmax_backward_kernel<T, true, kBlock>
            <<<blocks, threads, 0, launch.stream>>>(ys, gs, dst, meta, n_rows, n, y_step, g_step);
      } else {
        softmax_backward_kernel<T, false, kBlock>
            <<<blocks, threads, 0, launch.stream>>>(ys, gs, dst, meta, n_rows, n, y_step, g_step);
      }
      MICROLLM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace microllm
