// Merging the dims of N strided operands that share one logical shape (internal header): adjacent dims
// that are contiguous in every operand become one, so a contiguous tensor is a single row. Used by the
// CPU row loops and by the CUDA kernels' strided indexing.
#pragma once

#include <array>
#include <cstdint>

#include "microllm/core/shape.h"

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

}  // namespace microllm::detail
