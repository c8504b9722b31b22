// Row access shared by the row-wise kernels (reduce, indexing, softmax, loss; internal header): 16-byte
// packs, a visitor over the elements of one row that a thread owns (vectorized when the row is contiguous
// and aligned), the online (max, sum of exp) statistics of a row and their warp/block combination.
#pragma once

#include <cmath>

#include "common.cuh"

namespace microllm::cuda_kernels::rows {

template <int N, typename T>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements per 16-byte load.
template <typename T>
constexpr int kPack = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

MICROLLM_HD inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether every row of t (along its last dim) moves in 16-byte vectors: unit stride along the last dim, and the
// base and the stride of every leading dim of more than one element on 16-byte boundaries.
inline bool rows_aligned16(const Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(t.element_size());
  if (!aligned16(t.data_ptr()) || t.stride(t.dim() - 1) != 1) return false;
  for (int d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * bytes) % 16 != 0) return false;
  }
  return true;
}

// t's strides along its first three dims: the (batch, head, position) or (batch, token, head) strides that the
// attention and paged kernels take with a unit stride along the last dim.
inline void strides3(const Tensor& t, int64_t (&s)[3]) {
  for (int d = 0; d < 3; ++d) s[d] = t.stride(d);
}

// The shape and strides of t's leading dims (all but the last): row r of t starts at the offset that
// make_strided_meta over these gives for r.
inline Shape leading_shape(const Tensor& t) {
  Shape s;
  for (int d = 0; d + 1 < t.dim(); ++d) s.push_back(t.size(d));
  return s;
}
inline Strides leading_strides(const Tensor& t) {
  Strides s;
  for (int d = 0; d + 1 < t.dim(); ++d) s.push_back(t.stride(d));
  return s;
}

// fn.template operator()<I>() with I the storage type of i32 or i64 ids / targets.
template <typename Fn>
void visit_index(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::i32: fn.template operator()<int32_t>(); break;
    case DType::i64: fn.template operator()<int64_t>(); break;
    default: throw DTypeError(op, str_cat("indices must be i32 or i64, got ", dtype));
  }
}

// Calls fn(index, values, count) for the elements of a row of n (`stride` apart) that thread `tid` of
// `nthreads` owns: 16-byte packs (count = kPack<T>, index the first of them) when the row is unit-stride
// and 16-byte aligned, else (and for the tail) single elements (count = 1). Four packs are loaded before
// the first is used, so several loads are in flight per thread.
template <typename T, typename Fn>
__device__ __forceinline__ void visit_row(const T* row, int64_t n, int64_t stride, int tid, int nthreads, Fn&& fn) {
  constexpr int V = kPack<T>;
  if (V > 1 && stride == 1 && aligned16(row)) {
    using P = Pack<V, T>;
    const P* packs = reinterpret_cast<const P*>(row);
    const int64_t np = n / V;
    constexpr int U = 4;
    int64_t p = tid;
    for (; p + (U - 1) * static_cast<int64_t>(nthreads) < np; p += U * static_cast<int64_t>(nthreads)) {
      P buf[U];
#pragma unroll
      for (int u = 0; u < U; ++u) buf[u] = packs[p + u * static_cast<int64_t>(nthreads)];
#pragma unroll
      for (int u = 0; u < U; ++u) fn((p + u * static_cast<int64_t>(nthreads)) * V, buf[u].v, V);
    }
    for (; p < np; p += nthreads) {
      const P b = packs[p];
      fn(p * V, b.v, V);
    }
    for (int64_t i = np * V + tid; i < n; i += nthreads) {
      const T v = row[i];
      fn(i, &v, 1);
    }
  } else {
    for (int64_t i = tid; i < n; i += nthreads) {
      const T v = row[i * stride];
      fn(i, &v, 1);
    }
  }
}

// exp per element: the fast hardware exp2 in f32 (a few ulp; the results are stored in f32 or narrower),
// the accurate one in f64. log, once per row: through f64, so the f32 result is the correctly rounded one
// (the CPU's std::log), e.g. log_softmax of two equal values is exactly -log(2.0f).
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return static_cast<float>(log(static_cast<double>(x))); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}

// Online log-sum-exp state of one thread: sum = sum(exp(x - max)) over the values seen. max stays -inf
// (and sum 0) while every value seen is -inf; NaNs pass into sum.
template <typename A>
struct OnlineStats {
  A max = neg_inf<A>();
  A sum = 0;

  // One pack: its max first, so the running sum is rescaled at most once per pack.
  template <typename T>
  __device__ __forceinline__ void add(const T* values, int count) {
    A chunk_max = neg_inf<A>();
#pragma unroll
    for (int j = 0; j < kPack<T> && j < count; ++j) chunk_max = fmax(chunk_max, to_acc(values[j]));
    if (chunk_max > max) {
      sum *= fast_exp(max - chunk_max);
      max = chunk_max;
    }
    if (max == neg_inf<A>()) return;  // only -inf (or NaN) so far: exp(-inf - -inf) would be NaN
#pragma unroll
    for (int j = 0; j < kPack<T> && j < count; ++j) sum += fast_exp(to_acc(values[j]) - max);
  }

  // The thread's sum rescaled to the group max `m`.
  __device__ __forceinline__ A sum_at(A m) const { return max == neg_inf<A>() ? A(0) : sum * fast_exp(max - m); }

  // After the group reduction: a row of only -inf has no distribution; its sum is NaN, as on the CPU
  // (whose sum of exp(-inf - -inf) is NaN), so every output of the row is NaN.
  __device__ __forceinline__ void finish() {
    if (max == neg_inf<A>()) sum = static_cast<A>(NAN);
  }
};

// Combines the per-lane stats of a warp; every lane gets the row's (max, sum).
template <typename A>
__device__ __forceinline__ OnlineStats<A> warp_combine(OnlineStats<A> s) {
  OnlineStats<A> r;
  r.max = warp_max(s.max);
  r.sum = warp_sum(s.sum_at(r.max));
  r.finish();
  return r;
}

// The same over a block (scratch: 32 values of shared memory); every thread gets the result.
template <typename A>
__device__ __forceinline__ OnlineStats<A> block_combine(OnlineStats<A> s, A* scratch) {
  OnlineStats<A> r;
  r.max = block_max(s.max, scratch);
  r.sum = block_sum(s.sum_at(r.max), scratch);
  r.finish();
  return r;
}

}  // namespace microllm::cuda_kernels::rows
