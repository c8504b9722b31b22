// The f32 fast path of the CPU attention (internal header): the same math as attention.cpp, for the case
// training and generation hit (f32, head dims unit-stride, no mask), with loops the compiler vectorizes.
#pragma once

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm::cpu {

// True when the fast path handles these operands (grad_out may be undefined for the forward).
bool attention_fast_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const Tensor& grad_out = Tensor());
void attention_fast(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, const Tensor& out,
                    const Tensor& lse);
void attention_backward_fast(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                             const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                             const Tensor& grad_v);

}  // namespace microllm::cpu
