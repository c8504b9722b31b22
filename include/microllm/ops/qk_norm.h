// QK-norm (Qwen3, Gemma 3): an attention layer's queries and keys, each head normalized over its D elements by the
// weight of its kind, as one op so that a backend can run both in one kernel (CUDA does: a warp a head, norm.cu).
// Equal to rms_norm(q, q_weight, eps) and rms_norm(k, k_weight, eps) (ops/norm.h): the same roundings and sums.
// Inference only: training composes the two rms_norms (nn::Attention).
#pragma once

#include <utility>

#include "microllm/core/tensor.h"

namespace microllm {

// q [.., Hq, D] and k [.., Hk, D] (views of the qkv projection's columns will do), q_weight and k_weight [D]; one
// float dtype and device for all. Returns {q, k} normalized, contiguous.
std::pair<Tensor, Tensor> qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                                      double eps);

}  // namespace microllm
