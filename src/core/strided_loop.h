// Row-by-row iteration over N strided operands that share one logical shape (internal header).
// Adjacent dims that are contiguous for every operand are merged first, so a contiguous tensor is one
// long row; rows are split across threads.
#pragma once

#include <array>
#include <cstdint>

#include "microllm/core/shape.h"
#include "parallel.h"

namespace microllm::detail {

template <size_t N>
struct RowLayout {
  Shape shape;                   // merged shape; the last dim is the row
  std::array<Strides, N> strides;
};

template <size_t N>
RowLayout<N> merge_dims(const Shape& shape, const std::array<Strides, N>& strides) {
  RowLayout<N> out;
  if (shape.empty()) {
    out.shape = Shape{1};
    for (size_t k = 0; k < N; ++k) out.strides[k] = Strides{0};
    return out;
  }
  out.shape.push_back(shape[0]);
  for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][0]);
  for (int d = 1; d < shape.size(); ++d) {
    bool mergeable = true;
    const int last = out.shape.size() - 1;
    for (size_t k = 0; k < N; ++k) {
      if (out.strides[k][last] != strides[k][d] * shape[d]) mergeable = false;
    }
    if (shape[d] == 1) continue;  // size-1 dims never affect offsets
    if (out.shape[last] == 1) mergeable = true;  // and neither does a size-1 dim already kept
    if (mergeable) {
      out.shape[last] *= shape[d];
      for (size_t k = 0; k < N; ++k) out.strides[k][last] = strides[k][d];
    } else {
      out.shape.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  return out;
}

// row_fn(const std::array<int64_t, N>& row_offsets, int64_t row_length, const std::array<int64_t, N>& row_strides)
template <size_t N, typename RowFn>
void for_each_row(const Shape& shape, const std::array<Strides, N>& strides, RowFn&& row_fn) {
  if (shape.numel() == 0) return;
  const RowLayout<N> layout = merge_dims<N>(shape, strides);
  const int rank = layout.shape.size();
  const int64_t row_length = layout.shape[rank - 1];
  const int64_t rows = layout.shape.numel() / row_length;
  std::array<int64_t, N> row_strides;
  for (size_t k = 0; k < N; ++k) row_strides[k] = layout.strides[k][rank - 1];
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(row_length, 1));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      std::array<int64_t, N> offsets{};
      int64_t rest = row;
      for (int d = rank - 2; d >= 0; --d) {
        const int64_t i = rest % layout.shape[d];
        rest /= layout.shape[d];
        for (size_t k = 0; k < N; ++k) offsets[k] += i * layout.strides[k][d];
      }
      row_fn(offsets, row_length, row_strides);
    }
  });
}

}  // namespace microllm::detail
