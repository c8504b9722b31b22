// Row-by-row iteration over N strided operands that share one logical shape (internal header).
// Adjacent dims that are contiguous for every operand are merged first, so a contiguous tensor is one
// long row; rows are split across threads.
#pragma once

#include <array>
#include <cstdint>

#include "microllm/core/shape.h"
#include "merge_dims.h"
#include "parallel.h"

namespace microllm::detail {

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
