// RMSNorm's arithmetic on the device, defined once for the norm kernels (norm.cu) and the kernels that fold a norm
// into their loads (the paged decode attention's QK-norm, paged_kernels.cuh), so that both give the same bits:
// y = round(w * round(h * rstd)) with rstd = 1 / sqrt(sum(h^2) / n + eps), transformers' roundings to the model dtype.
#pragma once

#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "rows.cuh"

namespace microllm::cuda_kernels {

// 1 / sqrt(mean of squares + eps), from a row's sum of squares over n elements.
template <typename A>
__device__ __forceinline__ A rms_rstd(A sum_sq, int64_t n, A eps) {
  return A(1) / std::sqrt(sum_sq / static_cast<A>(n) + eps);
}

// One element of the normalized row before its store rounds it: w * round(h * rstd).
template <typename T>
__device__ __forceinline__ acc_t<T> rms_scaled(acc_t<T> w, acc_t<T> h, acc_t<T> rstd) {
  return w * round_to<T>(h * rstd);
}

// qk_rms_norm's warp row (norm.cu's normalize_row with one 16-byte pack a lane) over a head x of D <= 32 * V elements,
// V = 16 / sizeof(T), at element stride `step`: lane l sums the squares of elements [l V, l V + V) in order, the warp
// adds the lanes' sums by its butterfly, and store(d, y) receives each of the lane's elements normalized by `weight`
// (unit stride, 16-byte aligned) and rounded to T. Every lane of the warp calls it.
template <typename T, typename Store>
__device__ __forceinline__ void normalize_head_in_warp(const T* x, int64_t step, const T* weight, float eps, int D,
                                                       int lane, Store&& store) {
  static_assert(std::is_same_v<acc_t<T>, float>, "16-bit and f32 heads");
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  using Group = rows::Pack<V, T>;
  const int d0 = lane * V;
  Group g{};  // zeros past D
  if (d0 < D) {
    if (step == 1 && rows::aligned16(x + d0)) {  // one 16-byte load
      g = *reinterpret_cast<const Group*>(x + d0);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) g.v[v] = x[(d0 + v) * step];
    }
  }
  float h[V];
  float sum_sq = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    h[v] = to_acc(g.v[v]);
    sum_sq += h[v] * h[v];
  }
  const float rstd = rms_rstd(warp_sum(sum_sq), D, eps);
  if (d0 >= D) return;
  const Group w = *reinterpret_cast<const Group*>(weight + d0);  // the weight: contiguous, 16-byte aligned
#pragma unroll
  for (int v = 0; v < V; ++v) store(d0 + v, from_acc<T>(rms_scaled<T>(to_acc(w.v[v]), h[v], rstd)));
}

}  // namespace microllm::cuda_kernels
