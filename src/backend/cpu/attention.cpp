// CPU scaled-dot-product attention with grouped-query heads: the plain reference the CUDA kernels are
// checked against. One query row (b, h, i) at a time; at most one row of S scores per thread, f32
// accumulation (f64 for f64 inputs).
//
// Backward, with P = softmax(scale * q k^T) recomputed from the lse (no [T, S] matrix is kept):
//   dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O));  dQ = scale * dS K;  dK = scale * dS^T Q
// rowsum(dO * O) is computed as rowsum(P * dP), its value for the exact O: the stored O is rounded to
// f16/bf16, and dP - rowsum cancels, which would multiply that rounding several times in dQ and dK.
// It runs in two passes so that no two threads write one element: dQ by query row, then dK and dV by
// key row (b, kv_head, j), summing over the query heads of that kv head's group.
// f32 without a mask, with unit-stride head dims, takes the vectorized loops of attention_fast.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_fast.h"
#include "cpu_backend.h"
#include "dispatch.h"
#include "microllm/backend/kernel_choices.h"

namespace microllm {
namespace {

// A rank-4 strided operand: row (a, b, c) starts at row(a, b, c), its elements `step` apart.
template <typename T>
struct Rows4 {
  const T* data;
  int64_t s0, s1, s2, step;
  explicit Rows4(const Tensor& t)
      : data(static_cast<const T*>(t.data_ptr())),
        s0(t.stride(0)),
        s1(t.stride(1)),
        s2(t.stride(2)),
        step(t.stride(3)) {}
  const T* row(int64_t a, int64_t b, int64_t c) const { return data + a * s0 + b * s1 + c * s2; }
};

template <typename A, typename T>
A dot(const T* x, int64_t x_step, const T* y, int64_t y_step, int64_t n) {
  A sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += A(cpu::load(x + d * x_step)) * A(cpu::load(y + d * y_step));
  return sum;
}

// Sizes and the visibility rule shared by the forward and the backward.
struct Layout {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;
  int64_t group;  // query heads per kv head
  double scale;
  bool causal;
  int64_t q_offset;
  AttentionParams visibility;  // the causal rule, q_offset and window
  const uint8_t* mask;  // [B, Hq, T, S] view, or null
  int64_t m0, m1, m2, m3;

  Layout(const Tensor& q, const Tensor& k, const Tensor& mask_view, const AttentionParams& params)
      : batch(q.size(0)),
        q_heads(q.size(1)),
        kv_heads(k.size(1)),
        q_len(q.size(2)),
        kv_len(k.size(2)),
        head_dim(q.size(3)),
        group(q_heads / std::max<int64_t>(kv_heads, 1)),
        scale(params.scale != 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)))),
        causal(params.causal),
        q_offset(params.q_offset),
        visibility(params),
        mask(mask_view.defined() ? static_cast<const uint8_t*>(mask_view.data_ptr()) : nullptr),
        m0(mask ? mask_view.stride(0) : 0),
        m1(mask ? mask_view.stride(1) : 0),
        m2(mask ? mask_view.stride(2) : 0),
        m3(mask ? mask_view.stride(3) : 0) {}

  // Keys key_begin(i)..end-1 pass the causal rule and the window for query i (position q_offset + i).
  int64_t key_end(int64_t i) const { return causal ? std::min(kv_len, q_offset + i + 1) : kv_len; }
  bool allowed(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (j >= key_end(i) || j < visibility.key_begin(i)) return false;
    return mask == nullptr || mask[b * m0 + h * m1 + i * m2 + j * m3] != 0;
  }
  // Chunk size for parallel_for when one item costs about `work` multiply-adds.
  static int64_t grain(int64_t work) {
    return std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(work, 1));
  }
};

// Fills scores[j] = scale * q_i . k_j for the visible keys (-inf for the others); returns the max score,
// -inf when query (b, h, i) sees no key.
template <typename T, typename A>
A score_row(const Layout& L, const Rows4<T>& q, const Rows4<T>& k, int64_t b, int64_t h, int64_t i,
            std::vector<A>& scores) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const T* qi = q.row(b, h, i);
  const int64_t hk = h / L.group;
  A max = neg_inf;
  for (int64_t j = 0; j < L.kv_len; ++j) {
    scores[j] = neg_inf;
    if (!L.allowed(b, h, i, j)) continue;
    scores[j] = A(L.scale) * dot<A>(qi, q.step, k.row(b, hk, j), k.step, L.head_dim);
    max = std::max(max, scores[j]);
  }
  return max;
}

// log(sum_j exp(scores[j])) given the row's max (which must be finite).
template <typename A>
A log_sum_exp(const std::vector<A>& scores, A max) {
  A sum = 0;
  for (A s : scores) sum += std::exp(s - max);  // exp(-inf) = 0 for hidden keys
  return max + std::log(sum);
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  if (!out.is_contiguous()) {  // ops hands a token-major view: the loops below write [B, Hq, T, D] contiguous
    const Tensor staged = Tensor::empty(out.shape(), out.dtype(), out.device());
    attention(q, k, v, mask, params, staged, lse);
    Tensor(out).copy_(staged);  // a handle on the same storage
    return;
  }
  const bool fast = cpu::attention_fast_applies(q, k, v, mask);
  if (recording_kernel_choices()) {
    record_kernel_choice("attention",
                         str_cat("q ", q.shape(), " ", q.dtype(), ", keys ", k.size(2),
                                 params.window > 0 ? str_cat(", window ", params.window) : std::string()),
                         fast ? "f32 vectorized loops (attention_fast.cpp)" : "reference loops (attention.cpp)");
  }
  if (fast) return cpu::attention_fast(q, k, v, params, out, lse);
  cpu::visit_float(q.dtype(), "attention", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const Layout L(q, k, mask, params);
    const Rows4<T> qs(q), ks(k), vs(v);
    T* o = static_cast<T*>(out.data_ptr());  // [B, Hq, T, D] contiguous
    float* lse_out = lse.data<float>();      // [B, Hq, T] contiguous
    const int64_t rows = L.batch * L.q_heads * L.q_len;
    detail::parallel_for(0, rows, Layout::grain(2 * L.kv_len * L.head_dim), [&](int64_t lo, int64_t hi) {
      std::vector<A> scores(static_cast<size_t>(L.kv_len));  // [S], this thread's one score row
      std::vector<A> acc(static_cast<size_t>(L.head_dim));   // [D]
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t i = r % L.q_len, h = (r / L.q_len) % L.q_heads, b = r / (L.q_len * L.q_heads);
        const int64_t hk = h / L.group;
        const A max = score_row(L, qs, ks, b, h, i, scores);
        T* out_row = o + r * L.head_dim;
        if (max == -std::numeric_limits<A>::infinity()) {  // sees no key: output 0, lse -inf
          for (int64_t d = 0; d < L.head_dim; ++d) cpu::store(out_row + d, A(0));
          lse_out[r] = -std::numeric_limits<float>::infinity();
          continue;
        }
        std::fill(acc.begin(), acc.end(), A(0));
        A sum = 0;
        for (int64_t j = 0; j < L.kv_len; ++j) {
          const A p = std::exp(scores[j] - max);
          if (p == 0) continue;  // hidden (or negligible) key
          sum += p;
          const T* vj = vs.row(b, hk, j);
          for (int64_t d = 0; d < L.head_dim; ++d) acc[d] += p * A(cpu::load(vj + d * vs.step));
        }
        for (int64_t d = 0; d < L.head_dim; ++d) cpu::store(out_row + d, acc[d] / sum);
        lse_out[r] = static_cast<float>(max + std::log(sum));
      }
    });
  });
}

// The lse is f32 whatever the inputs; for f64 inputs each row's lse is recomputed here in f64, so that
// the f64 gradients are exact (f64 finite differences check them). Other dtypes use the given lse.
void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const AttentionParams& params, const Tensor& /*out: see the top*/,
                                    const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  if (cpu::attention_fast_applies(q, k, v, mask, grad_out)) {
    return cpu::attention_backward_fast(q, k, v, params, lse, grad_out, grad_q, grad_k, grad_v);
  }
  cpu::visit_float(q.dtype(), "attention_backward", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    constexpr bool kRecomputeLse = std::is_same_v<T, double>;
    const A neg_inf = -std::numeric_limits<A>::infinity();
    const Layout L(q, k, mask, params);
    const A scale = A(L.scale);
    const Rows4<T> qs(q), ks(k), vs(v), dos(grad_out);
    const Tensor lse_c = lse.contiguous();
    const float* lse_in = lse_c.data<float>();
    const int64_t rows = L.batch * L.q_heads * L.q_len;
    // Per query row: the lse used for P, and delta = rowsum(P * dP) = rowsum(dO * O). [B, Hq, T] each.
    std::vector<A> row_lse(static_cast<size_t>(rows)), delta(static_cast<size_t>(rows));

    // Pass 1, by query row (b, h, i): dQ_i = scale * sum_j dS_ij k_j.
    T* dq = static_cast<T*>(grad_q.data_ptr());  // [B, Hq, T, D] contiguous
    detail::parallel_for(0, rows, Layout::grain(3 * L.kv_len * L.head_dim), [&](int64_t lo, int64_t hi) {
      std::vector<A> scores(static_cast<size_t>(L.kv_len));  // [S]
      std::vector<A> acc(static_cast<size_t>(L.head_dim));   // [D]
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t i = r % L.q_len, h = (r / L.q_len) % L.q_heads, b = r / (L.q_len * L.q_heads);
        const int64_t hk = h / L.group;
        const A max = score_row(L, qs, ks, b, h, i, scores);
        A lse_i = lse_in[r];
        if (max == neg_inf)
          lse_i = neg_inf;
        else if (kRecomputeLse)
          lse_i = log_sum_exp(scores, max);
        const T* dOi = dos.row(b, h, i);
        // scores[j] becomes P_ij (0 for hidden keys); delta_i = sum_j P_ij dP_ij.
        A delta_i = 0;
        for (int64_t j = 0; j < L.kv_len; ++j) {
          scores[j] = lse_i == neg_inf || scores[j] == neg_inf ? A(0) : std::exp(scores[j] - lse_i);
          if (scores[j] != 0) delta_i += scores[j] * dot<A>(dOi, dos.step, vs.row(b, hk, j), vs.step, L.head_dim);
        }
        row_lse[r] = lse_i;
        delta[r] = delta_i;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < L.kv_len; ++j) {
          const A p = scores[j];
          if (p == 0) continue;
          const A ds = p * (dot<A>(dOi, dos.step, vs.row(b, hk, j), vs.step, L.head_dim) - delta_i);
          const T* kj = ks.row(b, hk, j);
          for (int64_t d = 0; d < L.head_dim; ++d) acc[d] += ds * A(cpu::load(kj + d * ks.step));
        }
        for (int64_t d = 0; d < L.head_dim; ++d) cpu::store(dq + r * L.head_dim + d, scale * acc[d]);
      }
    });

    // Pass 2, by key row (b, hk, j): dV_j = sum P_ij dO_i, dK_j = scale * sum dS_ij q_i over the query
    // heads of the group and the queries i that see key j.
    T* dk = static_cast<T*>(grad_k.data_ptr());  // [B, Hkv, S, D] contiguous
    T* dv = static_cast<T*>(grad_v.data_ptr());
    const int64_t key_rows = L.batch * L.kv_heads * L.kv_len;
    detail::parallel_for(0, key_rows, Layout::grain(3 * L.group * L.q_len * L.head_dim), [&](int64_t lo, int64_t hi) {
      std::vector<A> dk_acc(static_cast<size_t>(L.head_dim)), dv_acc(static_cast<size_t>(L.head_dim));  // [D] each
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t j = r % L.kv_len, hk = (r / L.kv_len) % L.kv_heads, b = r / (L.kv_len * L.kv_heads);
        const T* kj = ks.row(b, hk, j);
        const T* vj = vs.row(b, hk, j);
        std::fill(dk_acc.begin(), dk_acc.end(), A(0));
        std::fill(dv_acc.begin(), dv_acc.end(), A(0));
        for (int64_t h = hk * L.group; h < (hk + 1) * L.group; ++h) {
          for (int64_t i = 0; i < L.q_len; ++i) {
            const int64_t qr = (b * L.q_heads + h) * L.q_len + i;
            if (!L.allowed(b, h, i, j) || row_lse[qr] == neg_inf) continue;
            const T* qi = qs.row(b, h, i);
            const T* dOi = dos.row(b, h, i);
            const A p = std::exp(scale * dot<A>(qi, qs.step, kj, ks.step, L.head_dim) - row_lse[qr]);
            const A ds = p * (dot<A>(dOi, dos.step, vj, vs.step, L.head_dim) - delta[qr]);
            for (int64_t d = 0; d < L.head_dim; ++d) {
              dv_acc[d] += p * A(cpu::load(dOi + d * dos.step));
              dk_acc[d] += ds * A(cpu::load(qi + d * qs.step));
            }
          }
        }
        for (int64_t d = 0; d < L.head_dim; ++d) {
          cpu::store(dk + r * L.head_dim + d, scale * dk_acc[d]);
          cpu::store(dv + r * L.head_dim + d, dv_acc[d]);
        }
      }
    });
  });
}

}  // namespace microllm
