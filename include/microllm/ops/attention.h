// Scaled dot-product attention with grouped-query heads (GQA):
//   q [B, Hq, T, D], k and v [B, Hkv, S, D], Hq a multiple of Hkv (query head h reads kv head
//   h / (Hq / Hkv)). scores = q k^T * scale; causal masks key j for query i when j > q_offset + i;
//   mask (u8, optional) broadcasts to [B, Hq, T, S], nonzero = may attend. Rows with no key output 0.
//   scale 0 means 1 / sqrt(D). Causal needs q_offset + T <= S (each query's own key must exist).
// Any strides: a [B, T, H, D] projection output can be passed as .transpose(1, 2) without a copy.
#pragma once

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm {

struct AttentionResult {
  Tensor out;  // [B, Hq, T, D], q's dtype; a view of [B, T, Hq, D] memory, so out.transpose(1, 2) is contiguous
  Tensor lse;  // [B, Hq, T] f32, log-sum-exp of the scaled, masked scores (for the backward)
};

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params = {},
                          const Tensor& mask = Tensor());

struct AttentionGrads {
  Tensor grad_q;
  Tensor grad_k;  // summed over the query heads that share each kv head
  Tensor grad_v;
};
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionResult& forward,
                                  const Tensor& grad_out, const AttentionParams& params = {},
                                  const Tensor& mask = Tensor());

// The attention probabilities under the same rules: softmax(q k^T * scale) over the keys each query may see,
// [B, Hq, T, S] f32, hidden keys 0, rows with no key all 0 (transformers' eager attention with
// output_attentions=True). A composition of matmul, masked_fill and softmax, for study: T x S per head.
Tensor attention_weights(const Tensor& q, const Tensor& k, const AttentionParams& params = {},
                         const Tensor& mask = Tensor());

}  // namespace microllm
