// CPU cross-entropy over logits [N, V] with integer targets [N], and its backward.
// Each row: logsumexp(x) - x[t], with the row max subtracted first; f32 accumulation (f64 for f64).
// Targets were checked by the ops layer: each is in [0, V) or equal to ignore_index.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// The max and log(sum(exp(x - max))) of one row of n elements `step` apart.
template <typename A, typename T>
std::pair<A, A> row_max_and_log_sum(const T* x, int64_t step, int64_t n) {
  A max = -std::numeric_limits<A>::infinity();
  for (int64_t v = 0; v < n; ++v) max = std::fmax(max, A(cpu::load(x + v * step)));
  A sum = 0;
  for (int64_t v = 0; v < n; ++v) sum += std::exp(A(cpu::load(x + v * step)) - max);
  return {max, std::log(sum)};
}

// Rows per parallel chunk, so that a chunk holds about kParallelGrain logits.
int64_t rows_per_chunk(int64_t vocab) {
  return std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(vocab, 1));
}

int64_t count_kept(const Tensor& targets, int64_t ignore_index) {
  int64_t kept = 0;
  for (int64_t n = 0; n < targets.size(0); ++n) kept += cpu::load_index(targets, n * targets.stride(0)) != ignore_index;
  return kept;
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& loss) {
  cpu::visit_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    const int64_t row_stride = logits.stride(0), step = logits.stride(1);
    const T* x = static_cast<const T*>(logits.data_ptr());
    // Per-row losses, summed afterwards in a fixed order: the result does not depend on the thread count.
    std::vector<A> row_loss(static_cast<size_t>(rows), A(0));
    detail::parallel_for(0, rows, rows_per_chunk(vocab), [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n) {
        const int64_t t = cpu::load_index(targets, n * targets.stride(0));
        if (t == ignore_index) continue;
        const T* xn = x + n * row_stride;
        const auto [max, log_sum] = row_max_and_log_sum<A>(xn, step, vocab);
        // (max - x[t]) first: it is exact; max + log_sum would round off log_sum's low digits.
        row_loss[static_cast<size_t>(n)] = (max - A(cpu::load(xn + t * step))) + log_sum;
      }
    });
    // Up to millions of tokens: a double sum keeps the rounding error from growing with N.
    double total = 0;
    for (A l : row_loss) total += static_cast<double>(l);
    const int64_t kept = count_kept(targets, ignore_index);
    const double mean = kept > 0 ? total / static_cast<double>(kept) : 0.0;
    if (loss.dtype() == DType::f64)
      *loss.data<double>() = mean;
    else
      *loss.data<float>() = static_cast<float>(mean);
  });
}

// d/dx[n, v] of mean_n (lse(x[n]) - x[n, t_n]) = (softmax(x[n])[v] - [v == t_n]) / count.
void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                        const Tensor& grad_loss, const Tensor& grad_logits) {
  cpu::visit_float(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    const int64_t row_stride = logits.stride(0), step = logits.stride(1);
    const T* x = static_cast<const T*>(logits.data_ptr());
    T* dx = static_cast<T*>(grad_logits.data_ptr());  // [N, V] contiguous
    const double g = grad_loss.dtype() == DType::f64 ? *grad_loss.data<double>() : *grad_loss.data<float>();
    const int64_t kept = count_kept(targets, ignore_index);
    const A scale = kept > 0 ? A(g / static_cast<double>(kept)) : A(0);
    detail::parallel_for(0, rows, rows_per_chunk(vocab), [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n) {
        const int64_t t = cpu::load_index(targets, n * targets.stride(0));
        T* dxn = dx + n * vocab;
        if (t == ignore_index) {
          for (int64_t v = 0; v < vocab; ++v) cpu::store(dxn + v, A(0));
          continue;
        }
        const T* xn = x + n * row_stride;
        const auto [max, log_sum] = row_max_and_log_sum<A>(xn, step, vocab);
        for (int64_t v = 0; v < vocab; ++v) {
          const A p = std::exp(A(cpu::load(xn + v * step)) - max - log_sum);
          cpu::store(dxn + v, scale * (p - A(v == t)));
        }
      }
    });
  });
}

}  // namespace microllm
