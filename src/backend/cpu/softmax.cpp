// CPU softmax and log-softmax over the last dim, and their backward from the forward's output.
// One row at a time: the row max is subtracted before exp (stable), sums accumulate in f32 (f64 for f64).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// Element offset of row `row` of t, a row being the last dim (rows counted row-major over the others).
int64_t row_offset(const Tensor& t, int64_t row) {
  int64_t offset = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    offset += (row % t.size(d)) * t.stride(d);
    row /= t.size(d);
  }
  return offset;
}

// Calls fn(row) for every row of t, rows split across threads.
template <typename Fn>
void for_each_last_dim_row(const Tensor& t, Fn&& fn) {
  const int64_t n = t.size(-1);
  if (t.numel() == 0) return;
  const int64_t rows = t.numel() / n;
  detail::parallel_for(0, rows, std::max<int64_t>(1, detail::kParallelGrain / n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) fn(r);
  });
}

}  // namespace

// A row of -inf only gives NaN (-inf - -inf), as torch does: there is no distribution to return.
void CpuBackend::softmax(const Tensor& x, bool log, const Tensor& out) {
  cpu::visit_float(x.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t n = x.size(-1);
    const int64_t step = x.stride(-1);
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());  // contiguous
    for_each_last_dim_row(x, [&](int64_t r) {
      const T* in = src + row_offset(x, r);
      T* o = dst + r * n;
      A max = -std::numeric_limits<A>::infinity();
      for (int64_t i = 0; i < n; ++i) max = std::fmax(max, A(cpu::load(in + i * step)));
      A sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(A(cpu::load(in + i * step)) - max);
      if (log) {
        const A log_sum = std::log(sum);
        for (int64_t i = 0; i < n; ++i) cpu::store(o + i, A(cpu::load(in + i * step)) - max - log_sum);
      } else {
        const A inv_sum = A(1) / sum;
        for (int64_t i = 0; i < n; ++i) cpu::store(o + i, std::exp(A(cpu::load(in + i * step)) - max) * inv_sum);
      }
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& grad_out, bool log, const Tensor& grad_x) {
  cpu::visit_float(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t n = y.size(-1);
    const int64_t y_step = y.stride(-1);
    const int64_t g_step = grad_out.stride(-1);
    const T* ys = static_cast<const T*>(y.data_ptr());
    const T* gs = static_cast<const T*>(grad_out.data_ptr());
    T* dst = static_cast<T*>(grad_x.data_ptr());  // contiguous
    for_each_last_dim_row(y, [&](int64_t r) {
      const T* yr = ys + row_offset(y, r);
      const T* gr = gs + row_offset(grad_out, r);
      T* dx = dst + r * n;
      // softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g)
      A sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const A g = cpu::load(gr + i * g_step);
        sum += log ? g : g * A(cpu::load(yr + i * y_step));
      }
      for (int64_t i = 0; i < n; ++i) {
        const A yi = cpu::load(yr + i * y_step);
        const A g = cpu::load(gr + i * g_step);
        cpu::store(dx + i, log ? g - std::exp(yi) * sum : yi * (g - sum));
      }
    });
  });
}

}  // namespace microllm
