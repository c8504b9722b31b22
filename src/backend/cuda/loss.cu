// CUDA cross-entropy over logits [N, V] with integer targets [N], and its backward. Fused: neither
// direction materializes softmax or an f32 copy of the logits.
//
// Forward: a block per row computes an online (max, sum of exp) over the row (16-byte packs when the row
// is unit-stride and aligned, four packs in flight per thread) and writes the row's loss,
// (max - x[t]) + log(sum), to an f32 (f64) buffer; one block then sums those in f64 in a fixed order and
// divides by the number of kept rows (0 when there are none), as the CPU does. The bytes of the logits are
// read once: the kernel runs at memory bandwidth when there are enough rows to fill the GPU.
// Backward: a one-block kernel counts the kept rows and turns grad_loss (a device scalar, never read on
// the host) into scale = grad_loss / count; then a block per row recomputes the row's statistics (first
// read) and writes scale * (softmax - onehot) in the logits' dtype (second read, one write); ignored rows
// get zeros. Targets outside [0, V) that are not ignore_index are reported (target_index) and their row
// gets loss 0 / gradient 0.
#include "../../core/cuda/device_errors.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels {
namespace {

using rows::kPack;
using rows::Pack;
using rows::visit_index;

constexpr unsigned kMaxBlocks = 1u << 20;
constexpr int kFinishThreads = 1024;
// Largest block of the row kernels, and the blocks per SM their registers must allow: two blocks of 512
// (64 registers a thread) keep enough loads in flight; f64 rows use 256 threads, one block.
template <typename T>
constexpr int kRowMaxThreads = std::is_same_v<T, double> ? 256 : 512;
template <typename T>
constexpr int kRowMinBlocks = std::is_same_v<T, double> ? 1 : 2;

// Block size for rows of `vocab` logits: about one 16-byte pack per thread and pass, up to 512 threads.
template <typename T>
int row_threads(int64_t vocab) {
  return static_cast<int>(std::clamp<int64_t>(rows::next_pow2((vocab + 7) / 8), 32, kRowMaxThreads<T>));
}

struct RowsView {
  int64_t n_rows, vocab;
  int64_t row_stride, step;  // logits[n, v] at n * row_stride + v * step
  int64_t target_stride;
  int64_t ignore_index;
};

// The (max, sum of exp) of one row; every thread of the block gets them.
template <typename T>
__device__ __forceinline__ rows::OnlineStats<acc_t<T>> row_stats(const T* row, const RowsView& view,
                                                                 acc_t<T>* scratch) {
  rows::OnlineStats<acc_t<T>> stats;
  rows::visit_row(row, view.vocab, view.step, threadIdx.x, blockDim.x,
                  [&](int64_t, const T* v, int count) { stats.add(v, count); });
  return rows::block_combine(stats, scratch);
}

// row_loss[n] = lse(x[n]) - x[n, t_n], 0 for ignored (and bad) targets.
template <typename T, typename I>
__global__ void __launch_bounds__(kRowMaxThreads<T>, kRowMinBlocks<T>)
    cross_entropy_rows(const T* __restrict__ logits, const I* __restrict__ targets, RowsView view,
                       acc_t<T>* __restrict__ row_loss, uint64_t* error_word) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t n = blockIdx.x; n < view.n_rows; n += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[n * view.target_stride]);
    if (t == view.ignore_index || t < 0 || t >= view.vocab) {  // the same for the whole block
      if (threadIdx.x == 0) {
        row_loss[n] = 0;
        if (t != view.ignore_index) detail::report_device_error(error_word, detail::DeviceErrorCode::target_index, t);
      }
      continue;
    }
    const T* row = logits + n * view.row_stride;
    const rows::OnlineStats<A> stats = row_stats(row, view, scratch);
    // (max - x[t]) first: it is exact; max + log(sum) would round off log(sum)'s low digits.
    if (threadIdx.x == 0) row_loss[n] = (stats.max - to_acc(row[t * view.step])) + rows::acc_log(stats.sum);
  }
}

// loss = sum(row_loss) / count(kept), in f64 and a fixed order (the same on every run); 0 when none kept.
template <typename A, typename I, typename Out>
__global__ void __launch_bounds__(kFinishThreads)
    cross_entropy_finish(const A* __restrict__ row_loss, const I* __restrict__ targets, RowsView view, Out* loss) {
  __shared__ double scratch[32];
  __shared__ long long count_scratch[32];
  double total = 0;
  long long kept = 0;
  for (int64_t n = threadIdx.x; n < view.n_rows; n += blockDim.x) {
    total += static_cast<double>(row_loss[n]);
    kept += static_cast<int64_t>(targets[n * view.target_stride]) != view.ignore_index;
  }
  total = block_sum(total, scratch);
  kept = block_sum(kept, count_scratch);
  if (threadIdx.x == 0) *loss = static_cast<Out>(kept > 0 ? total / static_cast<double>(kept) : 0.0);
}

// scale = grad_loss / count(kept) (0 when none kept), as the CPU computes it: the division in f64.
template <typename G, typename I, typename A>
__global__ void __launch_bounds__(kFinishThreads)
    cross_entropy_scale(const G* __restrict__ grad_loss, const I* __restrict__ targets, RowsView view, A* scale) {
  __shared__ long long count_scratch[32];
  long long kept = 0;
  for (int64_t n = threadIdx.x; n < view.n_rows; n += blockDim.x) {
    kept += static_cast<int64_t>(targets[n * view.target_stride]) != view.ignore_index;
  }
  kept = block_sum(kept, count_scratch);
  if (threadIdx.x == 0) {
    const double g = static_cast<double>(to_acc(*grad_loss));
    *scale = kept > 0 ? static_cast<A>(g / static_cast<double>(kept)) : A(0);
  }
}

// grad[n, v] = scale * (softmax(x[n])[v] - [v == t_n]); zero rows for ignored (and bad) targets.
template <typename T, typename I>
__global__ void __launch_bounds__(kRowMaxThreads<T>, kRowMinBlocks<T>)
    cross_entropy_backward_rows(const T* __restrict__ logits, const I* __restrict__ targets, RowsView view,
                                const acc_t<T>* __restrict__ scale_ptr, T* __restrict__ grad, uint64_t* error_word) {
  using A = acc_t<T>;
  constexpr int V = kPack<T>;
  __shared__ A scratch[32];
  const A scale = *scale_ptr;
  for (int64_t n = blockIdx.x; n < view.n_rows; n += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[n * view.target_stride]);
    T* out = grad + n * view.vocab;                            // [N, V] contiguous
    if (t == view.ignore_index || t < 0 || t >= view.vocab) {  // the same for the whole block
      if (threadIdx.x == 0 && t != view.ignore_index) {
        detail::report_device_error(error_word, detail::DeviceErrorCode::target_index, t);
      }
      const T zero = from_acc<T>(A(0));
      if (rows::aligned16(out)) {
        Pack<V, T> zeros;
        for (int j = 0; j < V; ++j) zeros.v[j] = zero;
        const int64_t np = view.vocab / V;
        for (int64_t p = threadIdx.x; p < np; p += blockDim.x) reinterpret_cast<Pack<V, T>*>(out)[p] = zeros;
        for (int64_t i = np * V + threadIdx.x; i < view.vocab; i += blockDim.x) out[i] = zero;
      } else {
        for (int64_t i = threadIdx.x; i < view.vocab; i += blockDim.x) out[i] = zero;
      }
      continue;
    }
    const T* row = logits + n * view.row_stride;
    const rows::OnlineStats<A> stats = row_stats(row, view, scratch);
    const A log_sum = rows::acc_log(stats.sum);
    const bool out_aligned = rows::aligned16(out);
    rows::visit_row(row, view.vocab, view.step, threadIdx.x, blockDim.x, [&](int64_t i, const T* v, int count) {
      Pack<V, T> result;
#pragma unroll
      for (int j = 0; j < V && j < count; ++j) {
        const A p = rows::fast_exp((to_acc(v[j]) - stats.max) - log_sum);
        result.v[j] = from_acc<T>(scale * (p - A(i + j == t ? 1 : 0)));
      }
      if (count == V && out_aligned) {
        *reinterpret_cast<Pack<V, T>*>(out + i) = result;
      } else {
#pragma unroll
        for (int j = 0; j < V && j < count; ++j) out[i + j] = result.v[j];
      }
    });
  }
}

RowsView rows_view(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return RowsView{logits.size(0), logits.size(1), logits.stride(0), logits.stride(1), targets.stride(0), ignore_index};
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& loss) {
  OpScope scope("cross_entropy", device_, detail::current_cuda_stream(device_));
  visit_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using A = acc_t<T>;
    MICROLLM_CHECK(loss.dtype() == (std::is_same_v<T, double> ? DType::f64 : DType::f32), DTypeError, "cross_entropy",
                   "loss must be ", std::is_same_v<T, double> ? "f64" : "f32", ", got ", loss.dtype());
    visit_index(targets.dtype(), "cross_entropy", [&]<typename I>() {
      Launch launch(loss);
      const RowsView view = rows_view(logits, targets, ignore_index);
      const I* t = static_cast<const I*>(targets.data_ptr());
      // Per-row losses (f32, f64 for f64 logits); at least one element so the pointer is valid.
      const Tensor row_loss = Tensor::empty({std::max<int64_t>(view.n_rows, 1)},
                                            std::is_same_v<A, double> ? DType::f64 : DType::f32, loss.device());
      A* per_row = static_cast<A*>(row_loss.data_ptr());
      if (view.n_rows > 0) {
        cross_entropy_rows<T, I><<<static_cast<unsigned>(std::min<int64_t>(view.n_rows, kMaxBlocks)),
                                   row_threads<T>(view.vocab), 0, launch.stream>>>(
            static_cast<const T*>(logits.data_ptr()), t, view, per_row, detail::cuda_error_word(device_));
        MICROLLM_CUDA_CHECK_LAUNCH();
      }
      cross_entropy_finish<A, I, A>
          <<<1, kFinishThreads, 0, launch.stream>>>(per_row, t, view, static_cast<A*>(loss.data_ptr()));
      MICROLLM_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                         const Tensor& grad_loss, const Tensor& grad_logits) {
  OpScope scope("cross_entropy_backward", device_, detail::current_cuda_stream(device_));
  visit_float(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using A = acc_t<T>;
    visit_index(targets.dtype(), "cross_entropy_backward", [&]<typename I>() {
      visit_float(grad_loss.dtype(), "cross_entropy_backward", [&]<typename G>() {
        const RowsView view = rows_view(logits, targets, ignore_index);
        if (view.n_rows == 0 || view.vocab == 0) return;
        Launch launch(grad_logits);
        const I* t = static_cast<const I*>(targets.data_ptr());
        const Tensor scale =
            Tensor::empty({1}, std::is_same_v<A, double> ? DType::f64 : DType::f32, grad_logits.device());
        A* scale_ptr = static_cast<A*>(scale.data_ptr());
        cross_entropy_scale<G, I, A>
            <<<1, kFinishThreads, 0, launch.stream>>>(static_cast<const G*>(grad_loss.data_ptr()), t, view, scale_ptr);
        MICROLLM_CUDA_CHECK_LAUNCH();
        cross_entropy_backward_rows<T, I>
            <<<static_cast<unsigned>(std::min<int64_t>(view.n_rows, kMaxBlocks)), row_threads<T>(view.vocab), 0,
               launch.stream>>>(static_cast<const T*>(logits.data_ptr()), t, view, scale_ptr,
                                static_cast<T*>(grad_logits.data_ptr()), detail::cuda_error_word(device_));
        MICROLLM_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace microllm
