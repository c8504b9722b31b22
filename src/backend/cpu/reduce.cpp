// CPU reductions along one dim, argmax, topk, scatter_add, embedding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// Calls fn(out_offset, x_offset) for each output element: x_offset is where its reduced line starts.
template <typename Fn>
void for_each_reduced_line(const Tensor& x, int dim, const Tensor& out, Fn&& fn) {
  Strides x_strides = x.strides();
  x_strides[dim] = 0;  // the output's dim has size 1, so this stride is never used
  detail::for_each_row<2>(out.shape(), {out.strides(), x_strides}, [&](const auto& off, int64_t n, const auto& step) {
    for (int64_t i = 0; i < n; ++i) fn(off[0] + i * step[0], off[1] + i * step[1]);
  });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int dim, const Tensor& out) {
  cpu::visit_numeric(x.dtype(), reduce_op_name(op), [&]<typename T>() {
    using A = std::conditional_t<std::is_integral_v<T>, int64_t, cpu::acc_t<T>>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    const int64_t n = x.size(dim);
    const int64_t stride = x.stride(dim);
    for_each_reduced_line(x, dim, out, [&](int64_t out_offset, int64_t x_offset) {
      const T* line = src + x_offset;
      A result = 0;
      if (op == ReduceOp::sum || op == ReduceOp::mean) {
        for (int64_t i = 0; i < n; ++i) result += static_cast<A>(cpu::load(line + i * stride));
        if (op == ReduceOp::mean) result = n > 0 ? result / static_cast<A>(n) : static_cast<A>(NAN);
      } else {
        // max/min propagate NaN: once `result` is NaN no comparison replaces it.
        result = static_cast<A>(cpu::load(line));
        for (int64_t i = 1; i < n; ++i) {
          const A v = static_cast<A>(cpu::load(line + i * stride));
          const bool better = op == ReduceOp::max ? v > result : v < result;
          if (better || v != v) result = v;
          if (result != result) break;
        }
      }
      cpu::store(dst + out_offset, result);
    });
  });
}

void CpuBackend::argmax(const Tensor& x, int dim, const Tensor& out) {
  cpu::visit_numeric(x.dtype(), "argmax", [&]<typename T>() {
    const T* src = static_cast<const T*>(x.data_ptr());
    auto* dst = static_cast<int64_t*>(out.data_ptr());
    const int64_t n = x.size(dim);
    const int64_t stride = x.stride(dim);
    for_each_reduced_line(x, dim, out, [&](int64_t out_offset, int64_t x_offset) {
      const T* line = src + x_offset;
      auto best = cpu::load(line);
      int64_t best_index = 0;
      for (int64_t i = 1; i < n && best == best; ++i) {  // a NaN is the maximum, as in torch
        const auto v = cpu::load(line + i * stride);
        if (v > best || v != v) {
          best = v;
          best_index = i;
        }
      }
      dst[out_offset] = best_index;
    });
  });
}

void CpuBackend::topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  cpu::visit_numeric(x.dtype(), "topk", [&]<typename T>() {
    const T* src = static_cast<const T*>(x.data_ptr());
    T* out_values = static_cast<T*>(values.data_ptr());
    auto* out_indices = static_cast<int64_t*>(indices.data_ptr());
    const int last = x.dim() - 1;
    const int64_t n = x.size(last);
    const int64_t stride = x.stride(last);
    // Rows of the output ([..., k], contiguous); row r of x starts at the offset of r's leading index.
    const int64_t rows = values.numel() / k;
    detail::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t r = lo; r < hi; ++r) {
        int64_t x_offset = 0;
        for (int64_t d = last - 1, rest = r; d >= 0; --d) {
          x_offset += rest % x.size(d) * x.stride(d);
          rest /= x.size(d);
        }
        const T* line = src + x_offset;
        std::iota(order.begin(), order.end(), 0);
        // Descending; NaN counts as the largest; ties keep the lower index first.
        auto before = [&](int64_t a, int64_t b) {
          const auto va = cpu::load(line + a * stride);
          const auto vb = cpu::load(line + b * stride);
          const bool a_nan = va != va, b_nan = vb != vb;
          if (a_nan != b_nan) return a_nan;
          if (!a_nan && va != vb) return va > vb;
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          out_values[r * k + j] = line[order[static_cast<size_t>(j)] * stride];
          out_indices[r * k + j] = order[static_cast<size_t>(j)];
        }
      }
    });
  });
}

void CpuBackend::scatter_add(const Tensor& index, const Tensor& src, int dim, const Tensor& out) {
  cpu::visit_numeric(src.dtype(), "scatter_add", [&]<typename T>() {
    const Tensor idx = index.contiguous();
    const Tensor values = src.contiguous();
    const int64_t* ids = idx.data<int64_t>();
    const T* vals = static_cast<const T*>(values.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());  // contiguous (the ops layer made it)
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= src.size(d);
    for (int d = dim + 1; d < src.dim(); ++d) inner *= src.size(d);
    const int64_t n_src = src.size(dim);
    const int64_t n_out = out.size(dim);
    // Each outer slice touches only its own slice of out, so slices run in parallel without races.
    detail::parallel_for(0, outer, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        for (int64_t j = 0; j < n_src; ++j) {
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t s = (o * n_src + j) * inner + i;
            T* target = dst + (o * n_out + ids[s]) * inner + i;
            cpu::store(target, cpu::load(target) + cpu::load(vals + s));
          }
        }
      }
    });
  });
}

void CpuBackend::embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const Tensor flat_ids = ids.contiguous();
  const int64_t count = flat_ids.numel();
  const int64_t dim = weight.size(1);
  const auto row_bytes = static_cast<size_t>(dim) * weight.element_size();
  if (row_bytes == 0) return;  // zero-width rows: nothing to copy (and memcpy must not see a null pointer)
  const Tensor rows = weight.stride(1) == 1 ? weight : weight.contiguous();
  const auto* src = static_cast<const char*>(rows.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t row_stride_bytes = rows.stride(0) * static_cast<int64_t>(rows.element_size());
  detail::parallel_for(0, count, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const int64_t id = cpu::load_index(flat_ids, n);
      std::memcpy(dst + n * static_cast<int64_t>(row_bytes), src + id * row_stride_bytes, row_bytes);
    }
  });
}

void CpuBackend::embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) {
  cpu::visit_float(grad_out.dtype(), "embedding_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const Tensor flat_ids = ids.contiguous();
    const Tensor grad = grad_out.contiguous();
    const int64_t count = flat_ids.numel();
    const int64_t vocab = grad_weight.size(0);
    const int64_t dim = grad_weight.size(1);
    // Accumulate in A, then round once; columns are split across threads so no two threads add to one cell.
    std::vector<A> sums(static_cast<size_t>(vocab * dim), A(0));
    const T* g = static_cast<const T*>(grad.data_ptr());
    detail::parallel_for(0, dim, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t n = 0; n < count; ++n) {
        const int64_t id = cpu::load_index(flat_ids, n);
        for (int64_t d = lo; d < hi; ++d) sums[static_cast<size_t>(id * dim + d)] += cpu::load(g + n * dim + d);
      }
    });
    T* dst = static_cast<T*>(grad_weight.data_ptr());
    for (int64_t i = 0; i < vocab * dim; ++i) cpu::store(dst + i, sums[static_cast<size_t>(i)]);
  });
}

}  // namespace microllm
