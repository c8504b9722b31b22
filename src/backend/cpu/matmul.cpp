// CPU matmul through OpenBLAS (cblas). f32/f64 operands are handed to BLAS in place when their strides
// allow (either dim may be the unit-stride one: a transposed view costs nothing); anything else, and
// every f16/bf16 operand, is packed into a contiguous f32/f64 buffer first. Large products are split over
// the OpenMP threads in fixed blocks, with BLAS single-threaded (see blocked_gemm).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

// A [rows, cols] matrix at `data` with strides (s0, s1), as cblas wants it (row-major).
template <typename A>
struct BlasMatrix {
  const A* data;
  bool transposed;  // the BLAS op to apply on top of the row-major storage
  int64_t ld;
};

// The matrix as BLAS can read it in place, or nothing when it must be packed.
template <typename A>
bool view_as_blas(const A* data, int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool transpose,
                  BlasMatrix<A>* out) {
  const int64_t max_cols = std::max<int64_t>(cols, 1), max_rows = std::max<int64_t>(rows, 1);
  if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= max_cols)) {
    *out = {data, transpose, rows == 1 ? max_cols : s0};
    return true;
  }
  if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= max_rows)) {  // column-major = transposed row-major
    *out = {data, !transpose, cols == 1 ? max_rows : s1};
    return true;
  }
  return false;
}

template <typename A>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const A* b, int64_t ldb, A* c,
          int64_t ldc) {
  const auto op_a = ta ? CblasTrans : CblasNoTrans;
  const auto op_b = tb ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  if constexpr (std::is_same_v<A, double>) {
    cblas_dgemm(CblasRowMajor, op_a, op_b, M, N, K, 1.0, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb),
                0.0, c, static_cast<blasint>(ldc));
  } else {
    cblas_sgemm(CblasRowMajor, op_a, op_b, M, N, K, 1.0f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb),
                0.0f, c, static_cast<blasint>(ldc));
  }
}

// Large products are cut into blocks of rows (or columns) of C, one BLAS call each, spread over the
// OpenMP threads, with BLAS itself single-threaded: OpenBLAS's own thread pool would compete for the cores
// with the OpenMP workers of the other kernels (on 2 cores, a spinning OpenMP worker and an OpenBLAS thread
// made every matmul several times slower). The blocks depend on the shape only, not on the thread count,
// so neither do the results.
constexpr int64_t kParallelGemmWork = int64_t{1} << 18;  // m * n * k below this: one call
constexpr int64_t kGemmBlock = 64;                       // the smallest block

void use_single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

template <typename A>
void blocked_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const A* b,
                  int64_t ldb, A* c, int64_t ldc) {
  use_single_threaded_blas();
  if (m * n * k < kParallelGemmWork || std::max(m, n) <= kGemmBlock) {
    return gemm<A>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  // At most about 64 blocks (each BLAS call packs the other operand again), of a multiple of 16 rows.
  const int64_t block_size = std::max(kGemmBlock, ((extent + 63) / 64 + 15) / 16 * 16);
  const int64_t blocks = (extent + block_size - 1) / block_size;
  detail::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t lo = block * block_size, size = std::min(block_size, extent - lo);
      if (by_rows) {  // rows [lo, lo + size) of C: rows of op(A)
        gemm<A>(ta, tb, size, n, k, ta ? a + lo : a + lo * lda, lda, b, ldb, c + lo * ldc, ldc);
      } else {  // columns of C: columns of op(B)
        gemm<A>(ta, tb, m, size, k, a, lda, tb ? b + lo * ldb : b + lo, ldb, c + lo, ldc);
      }
    }
  });
}

// Copies the [rows, cols] strided matrix into `buffer` (row-major, A precision).
template <typename T, typename A>
void pack(const T* data, int64_t rows, int64_t cols, int64_t s0, int64_t s1, std::vector<A>& buffer) {
  buffer.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) buffer[static_cast<size_t>(r * cols + c)] = cpu::load(data + r * s0 + c * s1);
  }
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias,
                        const Tensor& addend, const Tensor& out) {
  MICROLLM_CHECK(!addend.defined() || (addend.is_contiguous() && addend.shape() == out.shape()), ValueError, "matmul",
                 "the addend must be contiguous in the output's shape ", out.shape(), ", got ", addend.shape(),
                 " strides ", addend.strides());
  cpu::visit_float(a.dtype(), "matmul", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int rank = out.dim();
    const int64_t m = out.size(-2), n = out.size(-1);
    const int64_t k = transpose_a ? a.size(-2) : a.size(-1);
    MICROLLM_CHECK(m < INT_MAX && n < INT_MAX && k < INT_MAX, ShapeError, "matmul", "dims ", m, "x", k, "x", n,
                   " exceed the BLAS int range");
    if (m == 0 || n == 0) return;
    const int64_t batches = out.numel() / (m * n);
    constexpr bool c_in_place = std::is_same_v<T, A>;  // f32/f64 results land in out directly
    std::vector<A> bias_values;
    if (bias.defined()) {
      const T* bias_data = static_cast<const T*>(bias.data_ptr());
      for (int64_t j = 0; j < n; ++j) bias_values.push_back(cpu::load(bias_data + j * bias.stride(0)));
    }
    std::vector<A> pack_a, pack_b, result;
    const T* a_base = static_cast<const T*>(a.data_ptr());
    const T* b_base = static_cast<const T*>(b.data_ptr());
    T* out_base = static_cast<T*>(out.data_ptr());
    const T* addend_base = addend.defined() ? static_cast<const T*>(addend.data_ptr()) : nullptr;
    for (int64_t batch = 0; batch < batches; ++batch) {
      // Offsets of this batch entry in each operand (batch dims of a and b are already expanded).
      int64_t a_off = 0, b_off = 0, rest = batch;
      for (int d = rank - 3; d >= 0; --d) {
        const int64_t i = rest % out.size(d);
        rest /= out.size(d);
        a_off += i * a.stride(d);
        b_off += i * b.stride(d);
      }
      const T* a_data = a_base + a_off;
      const T* b_data = b_base + b_off;
      BlasMatrix<A> ma{}, mb{};
      const int64_t a_rows = a.size(-2), a_cols = a.size(-1), b_rows = b.size(-2), b_cols = b.size(-1);
      bool a_direct = false, b_direct = false;
      if constexpr (std::is_same_v<T, A>) {
        a_direct = view_as_blas<A>(a_data, a_rows, a_cols, a.stride(-2), a.stride(-1), transpose_a, &ma);
        b_direct = view_as_blas<A>(b_data, b_rows, b_cols, b.stride(-2), b.stride(-1), transpose_b, &mb);
      }
      if (!a_direct) {
        pack<T, A>(a_data, a_rows, a_cols, a.stride(-2), a.stride(-1), pack_a);
        ma = {pack_a.data(), transpose_a, std::max<int64_t>(a_cols, 1)};
      }
      if (!b_direct) {
        pack<T, A>(b_data, b_rows, b_cols, b.stride(-2), b.stride(-1), pack_b);
        mb = {pack_b.data(), transpose_b, std::max<int64_t>(b_cols, 1)};
      }
      T* c = out_base + batch * m * n;
      A* product = c_in_place ? reinterpret_cast<A*>(c) : nullptr;
      if (!product) {
        result.resize(static_cast<size_t>(m * n));
        product = result.data();
      }
      blocked_gemm<A>(ma.transposed, mb.transposed, m, n, k, ma.data, ma.ld, mb.data, mb.ld, product, n);
      if (!bias_values.empty()) {  // the epilogue: one rounding for product + bias (+ addend)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) product[r * n + j] += bias_values[static_cast<size_t>(j)];
      }
      if (addend_base) {
        const T* add = addend_base + batch * m * n;
        for (int64_t i = 0; i < m * n; ++i) product[i] += cpu::load(add + i);
      }
      if (!c_in_place) {
        for (int64_t i = 0; i < m * n; ++i) cpu::store(c + i, result[static_cast<size_t>(i)]);
      }
    }
  });
}

}  // namespace microllm
