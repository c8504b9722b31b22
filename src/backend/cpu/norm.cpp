// CPU RMSNorm (optionally fused with the residual add) and its backward. One row is the last dim; rows are
// split across threads. Statistics in f32 (f64 for f64), with the roundings of Hugging Face's Qwen2RMSNorm
// so that bf16/f16 outputs match it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// Element offset of the first element of `row`, rows being all dims but the last in row-major order.
int64_t row_offset(const Tensor& t, int64_t row) {
  int64_t offset = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    const int64_t size = t.size(d);
    offset += (row % size) * t.stride(d);
    row /= size;
  }
  return offset;
}

// v rounded to the storage type T and read back: HF keeps these intermediates in the model dtype.
template <typename T, typename A>
A round_to(A v) {
  T stored{};
  cpu::store(&stored, v);
  return cpu::load(&stored);
}

// Rows per thread chunk, so that a chunk holds about kParallelGrain elements.
int64_t row_grain(int64_t row_length) {
  return std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(row_length, 1));
}

}  // namespace

// h = round(x + residual) (or x); rstd = 1 / sqrt(mean(h^2) + eps); y = round(w * round(h * rstd)),
// round() being the rounding to x's dtype.
void CpuBackend::rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& out,
                          const Tensor& h_out, const Tensor& rstd_out) {
  cpu::visit_float(x.dtype(), "rms_norm", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t n = x.size(-1);
    const int64_t rows = rstd_out.numel();
    const bool fused = residual.defined();
    const T* xs = static_cast<const T*>(x.data_ptr());
    const T* rs = fused ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    const T* ws = static_cast<const T*>(weight.data_ptr());
    T* ys = static_cast<T*>(out.data_ptr());                                // [rows, n] contiguous
    T* hs = h_out.defined() ? static_cast<T*>(h_out.data_ptr()) : nullptr;  // [rows, n] contiguous
    const int64_t x_step = x.stride(-1), r_step = fused ? residual.stride(-1) : 0, w_step = weight.stride(0);
    const A eps_a = static_cast<A>(eps);  // HF adds eps to an f32 tensor

    detail::parallel_for(0, rows, row_grain(n), [&](int64_t lo, int64_t hi) {
      std::vector<A> h(static_cast<size_t>(n));  // one row of h, already rounded to T
      for (int64_t row = lo; row < hi; ++row) {
        const T* x_row = xs + row_offset(x, row);
        const T* r_row = fused ? rs + row_offset(residual, row) : nullptr;
        A sum_sq = 0;
        for (int64_t j = 0; j < n; ++j) {
          A v = cpu::load(x_row + j * x_step);
          // The residual stream is stored in T, and it is that rounded h that gets normalized.
          if (fused) v = round_to<T>(v + cpu::load(r_row + j * r_step));
          h[static_cast<size_t>(j)] = v;
          sum_sq += v * v;
        }
        const A mean_sq = n > 0 ? sum_sq / static_cast<A>(n) : A(0);
        const A rstd = A(1) / std::sqrt(mean_sq + eps_a);
        // [rows], f32 or f64 (the ops layer picks; see src/ops/norm.cpp)
        if (rstd_out.dtype() == DType::f64)
          static_cast<double*>(rstd_out.data_ptr())[row] = rstd;
        else
          static_cast<float*>(rstd_out.data_ptr())[row] = static_cast<float>(rstd);
        for (int64_t j = 0; j < n; ++j) {
          const A hv = h[static_cast<size_t>(j)];
          if (hs) cpu::store(hs + row * n + j, hv);
          cpu::store(ys + row * n + j, cpu::load(ws + j * w_step) * round_to<T>(hv * rstd));
        }
      }
    });
  });
}

// With g = grad_out, w = weight and n = last dim:
//   grad_h = rstd * (w g - h * rstd^2 * mean(w g h));   grad_w = sum over rows of g * h * rstd.
// The roundings of the forward are treated as identities, as autograd does for HF's graph.
void CpuBackend::rms_norm_backward(const Tensor& grad_out, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                                   const Tensor& grad_h, const Tensor& grad_weight) {
  cpu::visit_float(h.dtype(), "rms_norm_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t n = h.size(-1);
    const int64_t rows = rstd.numel();
    const T* gs = static_cast<const T*>(grad_out.data_ptr());
    const T* hs = static_cast<const T*>(h.data_ptr());
    const T* ws = static_cast<const T*>(weight.data_ptr());
    T* dhs = static_cast<T*>(grad_h.data_ptr());       // [rows, n] contiguous
    T* dws = static_cast<T*>(grad_weight.data_ptr());  // [n] contiguous
    const int64_t g_step = grad_out.stride(-1), h_step = h.stride(-1), w_step = weight.stride(0);
    // rstd is f32, or f64 when the forward ran in f64 (the ops layer checked which).
    auto rstd_at = [&](int64_t row) -> A {
      const int64_t i = row * rstd.stride(0);
      if (rstd.dtype() == DType::f64) return static_cast<A>(static_cast<const double*>(rstd.data_ptr())[i]);
      return static_cast<A>(static_cast<const float*>(rstd.data_ptr())[i]);
    };

    detail::parallel_for(0, rows, row_grain(n), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const T* g_row = gs + row_offset(grad_out, row);
        const T* h_row = hs + row_offset(h, row);
        const A r = rstd_at(row);
        A dot = 0;  // sum(w g h)
        for (int64_t j = 0; j < n; ++j) {
          dot += cpu::load(ws + j * w_step) * cpu::load(g_row + j * g_step) * cpu::load(h_row + j * h_step);
        }
        const A c = n > 0 ? r * r * dot / static_cast<A>(n) : A(0);
        for (int64_t j = 0; j < n; ++j) {
          const A wg = cpu::load(ws + j * w_step) * cpu::load(g_row + j * g_step);
          cpu::store(dhs + row * n + j, r * (wg - cpu::load(h_row + j * h_step) * c));
        }
      }
    });

    // grad_w sums over rows: columns go to threads so each sum has one owner (no races, same result for
    // any thread count).
    detail::parallel_for(0, n, row_grain(rows), [&](int64_t lo, int64_t hi) {
      std::vector<A> sums(static_cast<size_t>(hi - lo), A(0));
      for (int64_t row = 0; row < rows; ++row) {
        const T* g_row = gs + row_offset(grad_out, row);
        const T* h_row = hs + row_offset(h, row);
        const A r = rstd_at(row);
        for (int64_t j = lo; j < hi; ++j) {
          sums[static_cast<size_t>(j - lo)] += cpu::load(g_row + j * g_step) * cpu::load(h_row + j * h_step) * r;
        }
      }
      for (int64_t j = lo; j < hi; ++j) cpu::store(dws + j, sums[static_cast<size_t>(j - lo)]);
    });
  });
}

}  // namespace microllm
