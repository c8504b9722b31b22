// The f32 fast path of the CPU attention: the reference's math (attention.cpp) with the loops turned so
// that every inner loop is unit-stride and free of reductions, which the compiler vectorizes:
//   scores_i[j] = sum_d (scale q_id) K^T[d][j]   (one pass over K^T [D, S] per query dim d)
//   out_i       = sum_j p_ij v_j                  (one pass over D per key)
// and the backward's dP, dQ, dK, dV the same way. Work is split by (batch, head) for the forward and by
// (batch, kv head) for the backward, so each thread owns the dK, dV rows it writes (no two threads add
// into one element, the same results on any thread count). Used for f32 without a mask when every head
// dim is unit-stride: what training and generation run; everything else takes the reference loops.
#include "attention_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dispatch.h"

namespace microllm::cpu {
namespace {

struct FastLayout {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, group;
  float scale;
  bool causal;
  int64_t q_offset;
  AttentionParams visibility;  // the causal rule, q_offset and window

  FastLayout(const Tensor& q, const Tensor& k, const AttentionParams& params)
      : batch(q.size(0)),
        q_heads(q.size(1)),
        kv_heads(k.size(1)),
        q_len(q.size(2)),
        kv_len(k.size(2)),
        head_dim(q.size(3)),
        group(q.size(1) / std::max<int64_t>(k.size(1), 1)),
        scale(static_cast<float>(params.scale != 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))))),
        causal(params.causal),
        q_offset(params.q_offset),
        visibility(params) {}
  // Query i sees keys [key_begin(i), key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::clamp<int64_t>(q_offset + i + 1, 0, kv_len) : kv_len; }
  int64_t key_begin(int64_t i) const { return std::min(visibility.key_begin(i), key_end(i)); }
};

// Row (a, b, c) of a rank-4 f32 tensor whose last dim is unit-stride.
struct RowsF {
  const float* data;
  int64_t s0, s1, s2;
  explicit RowsF(const Tensor& t)
      : data(static_cast<const float*>(t.data_ptr())), s0(t.stride(0)), s1(t.stride(1)), s2(t.stride(2)) {}
  const float* row(int64_t a, int64_t b, int64_t c) const { return data + a * s0 + b * s1 + c * s2; }
};

// out[d * S + j] = x[b, h, j, d]: the keys (or values) of one head, transposed.
void pack_transposed(const RowsF& x, int64_t b, int64_t h, int64_t S, int64_t D, float* out) {
  for (int64_t j = 0; j < S; ++j) {
    const float* xj = x.row(b, h, j);
    for (int64_t d = 0; d < D; ++d) out[d * S + j] = xj[d];
  }
}

// s[j] = sum_d (scale q[d]) kt[d][j] for begin <= j < end.
void score_row(const float* __restrict q, const float* __restrict kt, int64_t S, int64_t D, int64_t begin, int64_t end,
               float scale, float* __restrict s) {
  std::fill(s + begin, s + end, 0.0f);
  for (int64_t d = 0; d < D; ++d) {
    const float qd = scale * q[d];
    const float* __restrict ktd = kt + d * S;
    for (int64_t j = begin; j < end; ++j) s[j] += qd * ktd[j];
  }
}

// acc[d] += w * x[d]
inline void axpy(float w, const float* __restrict x, float* __restrict acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] += w * x[d];
}

}  // namespace

bool attention_fast_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const Tensor& grad_out) {
  if (mask.defined() || q.dtype() != DType::f32 || !q.device().is_cpu()) return false;
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return false;
  if (grad_out.defined() && grad_out.stride(3) != 1) return false;
  return q.size(3) > 0 && k.size(1) > 0 && q.size(1) % k.size(1) == 0;
}

void attention_fast(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, const Tensor& out,
                    const Tensor& lse) {
  const FastLayout L(q, k, params);
  const RowsF qs(q), ks(k), vs(v);
  float* o = static_cast<float*>(out.data_ptr());  // [B, Hq, T, D] contiguous
  float* lse_out = lse.data<float>();              // [B, Hq, T] contiguous
  const int64_t S = L.kv_len, D = L.head_dim;
  detail::parallel_for(0, L.batch * L.q_heads, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> kt(static_cast<size_t>(D * S)), scores(static_cast<size_t>(S)), acc(static_cast<size_t>(D));
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / L.q_heads, h = task % L.q_heads, hk = h / L.group;
      pack_transposed(ks, b, hk, S, D, kt.data());
      for (int64_t i = 0; i < L.q_len; ++i) {
        const int64_t r = task * L.q_len + i, begin = L.key_begin(i), end = L.key_end(i);
        float* out_row = o + r * D;
        if (end == begin) {  // sees no key: output 0, lse -inf (as the reference)
          std::fill(out_row, out_row + D, 0.0f);
          lse_out[r] = -std::numeric_limits<float>::infinity();
          continue;
        }
        score_row(qs.row(b, h, i), kt.data(), S, D, begin, end, L.scale, scores.data());
        const float max = *std::max_element(scores.begin() + begin, scores.begin() + end);
        float sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = begin; j < end; ++j) {
          const float p = std::exp(scores[static_cast<size_t>(j)] - max);
          sum += p;
          axpy(p, vs.row(b, hk, j), acc.data(), D);
        }
        for (int64_t d = 0; d < D; ++d) out_row[d] = acc[static_cast<size_t>(d)] / sum;
        lse_out[r] = max + std::log(sum);
      }
    }
  });
}

void attention_backward_fast(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                             const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                             const Tensor& grad_v) {
  const FastLayout L(q, k, params);
  const RowsF qs(q), ks(k), vs(v), dos(grad_out);
  const Tensor lse_c = lse.contiguous();
  const float* lse_in = lse_c.data<float>();
  float* dq = static_cast<float*>(grad_q.data_ptr());  // [B, Hq, T, D] contiguous
  float* dk = static_cast<float*>(grad_k.data_ptr());  // [B, Hkv, S, D] contiguous
  float* dv = static_cast<float*>(grad_v.data_ptr());
  const int64_t S = L.kv_len, D = L.head_dim;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // One task per (batch, kv head): its query heads one after another, so dK and dV rows have one writer.
  detail::parallel_for(0, L.batch * L.kv_heads, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> kt(static_cast<size_t>(D * S)), vt(static_cast<size_t>(D * S));
    std::vector<float> p(static_cast<size_t>(S)), dp(static_cast<size_t>(S)), acc(static_cast<size_t>(D));
    std::vector<float> dk_acc(static_cast<size_t>(S * D)), dv_acc(static_cast<size_t>(S * D));
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / L.kv_heads, hk = task % L.kv_heads;
      pack_transposed(ks, b, hk, S, D, kt.data());
      pack_transposed(vs, b, hk, S, D, vt.data());
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      for (int64_t h = hk * L.group; h < (hk + 1) * L.group; ++h) {
        for (int64_t i = 0; i < L.q_len; ++i) {
          const int64_t r = (b * L.q_heads + h) * L.q_len + i, begin = L.key_begin(i), end = L.key_end(i);
          float* dq_row = dq + r * D;
          const float lse_i = lse_in[r];
          if (end == begin || lse_i == neg_inf) {
            std::fill(dq_row, dq_row + D, 0.0f);
            continue;
          }
          const float* qi = qs.row(b, h, i);
          const float* doi = dos.row(b, h, i);
          // P_ij = exp(scale q_i.k_j - lse_i); dP_ij = dO_i . v_j; delta_i = sum_j P_ij dP_ij.
          score_row(qi, kt.data(), S, D, begin, end, L.scale, p.data());
          for (int64_t j = begin; j < end; ++j) p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - lse_i);
          score_row(doi, vt.data(), S, D, begin, end, 1.0f, dp.data());
          float delta = 0;
          for (int64_t j = begin; j < end; ++j) delta += p[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
          // dS_ij = P_ij (dP_ij - delta_i); dQ_i = scale sum_j dS_ij k_j; dK_j += dS_ij q_i; dV_j += P_ij dO_i.
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = begin; j < end; ++j) {
            const float pj = p[static_cast<size_t>(j)];
            const float ds = pj * (dp[static_cast<size_t>(j)] - delta);
            axpy(ds, ks.row(b, hk, j), acc.data(), D);
            axpy(ds, qi, dk_acc.data() + j * D, D);
            axpy(pj, doi, dv_acc.data() + j * D, D);
          }
          for (int64_t d = 0; d < D; ++d) dq_row[d] = L.scale * acc[static_cast<size_t>(d)];
        }
      }
      float* dk_rows = dk + task * S * D;
      float* dv_rows = dv + task * S * D;
      for (int64_t x = 0; x < S * D; ++x) {
        dk_rows[x] = L.scale * dk_acc[static_cast<size_t>(x)];
        dv_rows[x] = dv_acc[static_cast<size_t>(x)];
      }
    }
  });
}

}  // namespace microllm::cpu
