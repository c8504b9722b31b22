// Scaled-dot-product attention with grouped-query heads: checks, mask broadcasting, dispatch, and the
// backward (the kernels recompute P row by row from the forward's lse; see src/backend/cpu/attention.cpp).
#include "microllm/ops/attention.h"

#include <cmath>
#include <limits>

#include "checks.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/reduce.h"
#include "microllm/ops/softmax.h"

namespace microllm {
namespace {

// Checks q [B, Hq, T, D], k and v [B, Hkv, S, D], the params and the mask; returns the mask expanded to
// [B, Hq, T, S] (undefined when there is none).
Tensor check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                    const Tensor& mask) {
  checks::floating(op, q, "q");
  checks::floating(op, k, "k");
  checks::floating(op, v, "v");
  checks::same_dtype(op, q, "q", k, "k");
  checks::same_dtype(op, q, "q", v, "v");
  checks::same_device(op, q, "q", k, "k");
  checks::same_device(op, q, "q", v, "v");
  checks::rank(op, q, "q", 4);
  checks::rank(op, k, "k", 4);
  checks::rank(op, v, "v", 4);
  checks::same_shape(op, k, "k", v, "v");
  MICROLLM_CHECK(k.size(0) == q.size(0), ShapeError, op, "k shape ", k.shape(), " has batch ", k.size(0),
                 " but q shape ", q.shape(), " has batch ", q.size(0));
  MICROLLM_CHECK(k.size(3) == q.size(3), ShapeError, op, "k shape ", k.shape(), " has head dim ", k.size(3),
                 " but q shape ", q.shape(), " has head dim ", q.size(3));
  MICROLLM_CHECK(q.size(3) > 0, ShapeError, op, "head dim must be positive, got q shape ", q.shape());
  MICROLLM_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, ShapeError, op, "q has ", q.size(1),
                 " heads, which is not a multiple of the ", k.size(1), " kv heads of k ", k.shape());
  MICROLLM_CHECK(std::isfinite(params.scale), ValueError, op, "scale must be finite, got ", params.scale);
  MICROLLM_CHECK(params.q_offset >= 0, ValueError, op, "q_offset must be >= 0, got ", params.q_offset);
  MICROLLM_CHECK(params.window >= 0, ValueError, op, "window must be >= 0 (0: none), got ", params.window);
  MICROLLM_CHECK(params.window == 0 || params.causal, ValueError, op,
                 "a sliding window (window ", params.window, ") needs causal attention");
  // A causal query at position q_offset + i attends to itself, so its key must exist: more queries than
  // keys means the KV cache was not updated.
  MICROLLM_CHECK(!params.causal || params.q_offset + q.size(2) <= k.size(2), ValueError, op,
                 "causal attention needs q_offset + T <= S, got q_offset ", params.q_offset, ", T ", q.size(2), " (q ",
                 q.shape(), "), S ", k.size(2), " (k ", k.shape(), ")");
  if (!mask.defined()) return mask;
  MICROLLM_CHECK(mask.dtype() == DType::u8, DTypeError, op, "mask must be u8, got ", mask.dtype());
  checks::same_device(op, q, "q", mask, "mask");
  const Shape full{q.size(0), q.size(1), q.size(2), k.size(2)};
  bool broadcasts = mask.dim() <= 4;
  for (int d = 0; broadcasts && d < mask.dim(); ++d) {
    const int64_t want = full[4 - mask.dim() + d];
    broadcasts = mask.size(d) == want || mask.size(d) == 1;
  }
  MICROLLM_CHECK(broadcasts, ShapeError, op, "mask shape ", mask.shape(),
                 " does not broadcast to [B, Hq, T, S] = ", full);
  return mask.expand(full);
}

}  // namespace

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                          const Tensor& mask) {
  const Tensor full_mask = check_inputs("attention", q, k, v, params, mask);
  AttentionResult result;
  // [B, Hq, T, D] as a view of token-major memory [B, T, Hq, D]: out.transpose(1, 2), the layout the output
  // projection reads, is then contiguous and costs no copy.
  result.out = Tensor::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.dtype(), q.device()).transpose(1, 2);
  result.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::f32, q.device());  // [B, Hq, T]
  backend_for(q.device()).attention(q, k, v, full_mask, params, result.out, result.lse);
  return result;
}

// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dO * O)); dQ = scale * dS K; dK = scale * dS^T Q,
// dK and dV summed over the query heads that share a kv head.
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionResult& forward,
                                  const Tensor& grad_out, const AttentionParams& params, const Tensor& mask) {
  const char* op = "attention_backward";
  const Tensor full_mask = check_inputs(op, q, k, v, params, mask);
  checks::defined(op, forward.out, "forward.out");
  checks::defined(op, forward.lse, "forward.lse");
  checks::defined(op, grad_out, "grad_out");
  checks::same_shape(op, q, "q", forward.out, "forward.out");
  checks::same_shape(op, q, "q", grad_out, "grad_out");
  checks::same_dtype(op, q, "q", forward.out, "forward.out");
  checks::same_dtype(op, q, "q", grad_out, "grad_out");
  const Shape lse_shape{q.size(0), q.size(1), q.size(2)};
  MICROLLM_CHECK(forward.lse.shape() == lse_shape, ShapeError, op, "forward.lse shape ", forward.lse.shape(),
                 " does not match [B, Hq, T] = ", lse_shape);
  MICROLLM_CHECK(forward.lse.dtype() == DType::f32, DTypeError, op, "forward.lse must be f32, got ",
                 forward.lse.dtype());
  checks::same_device(op, q, "q", forward.out, "forward.out");
  checks::same_device(op, q, "q", forward.lse, "forward.lse");
  checks::same_device(op, q, "q", grad_out, "grad_out");
  AttentionGrads grads;
  grads.grad_q = Tensor::empty(q.shape(), q.dtype(), q.device());
  grads.grad_k = Tensor::empty(k.shape(), k.dtype(), k.device());
  grads.grad_v = Tensor::empty(v.shape(), v.dtype(), v.device());
  backend_for(q.device())
      .attention_backward(q, k, v, full_mask, params, forward.out, forward.lse, grad_out, grads.grad_q, grads.grad_k,
                          grads.grad_v);
  return grads;
}

// The probabilities the fused kernels never materialize, by composition: f32 scores of each kv head's query group
// as one matrix product, the causal rule, the window and the mask as -inf, a softmax, and rows without a key set to 0.
Tensor attention_weights(const Tensor& q, const Tensor& k, const AttentionParams& params, const Tensor& mask) {
  const Tensor full_mask = check_inputs("attention_weights", q, k, k, params, mask);
  const int64_t batch = q.size(0), q_heads = q.size(1), tokens = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2), group = q_heads / kv_heads;
  const double scale = params.scale != 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  const Tensor queries = cast(q, DType::f32).contiguous().reshape({batch, kv_heads, group * tokens, head_dim});
  Tensor scores = microllm::scale(matmul(queries, cast(k, DType::f32), false, true), scale)
                      .reshape({batch, q_heads, tokens, keys});
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  if (params.causal) {  // key j is hidden from query i when j > q_offset + i
    const Tensor key_index = Tensor::arange(0, static_cast<double>(keys), 1, DType::i64, q.device()).reshape({1, keys});
    const Tensor query_index =
        Tensor::arange(static_cast<double>(params.q_offset), static_cast<double>(params.q_offset + tokens), 1,
                       DType::i64, q.device())
            .reshape({tokens, 1});
    scores = masked_fill(scores, gt(key_index, query_index).expand(scores.shape()), minus_infinity);
    if (params.window > 0) {  // and when j <= q_offset + i - window: key + window < query + 1
      const Tensor shifted_keys =
          Tensor::arange(static_cast<double>(params.window), static_cast<double>(params.window + keys), 1, DType::i64,
                         q.device())
              .reshape({1, keys});
      const Tensor next_query =
          Tensor::arange(static_cast<double>(params.q_offset + 1), static_cast<double>(params.q_offset + tokens + 1),
                         1, DType::i64, q.device())
              .reshape({tokens, 1});
      scores = masked_fill(scores, lt(shifted_keys, next_query).expand(scores.shape()), minus_infinity);
    }
  }
  if (full_mask.defined()) {
    scores = masked_fill(scores, eq(full_mask, Tensor::scalar(0, DType::u8, q.device())), minus_infinity);
  }
  const Tensor no_key = eq(max(scores, -1, /*keepdim=*/true), Tensor::scalar(minus_infinity, DType::f32, q.device()));
  return masked_fill(softmax(scores, -1), no_key.expand(scores.shape()), 0);
}

}  // namespace microllm
