// Matrix products. a [..., M, K] @ b [..., K, N] -> [..., M, N]; leading (batch) dims broadcast.
// transpose_a / transpose_b use the transpose of the last two dims (no copy: the kernel reads the
// view). Floating dtypes; a and b share one; f16/bf16 compute in f32 and round once.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

struct MatmulGrads {
  Tensor grad_a;
  Tensor grad_b;
};
// grad_a = grad_out @ op(b)^T (as laid out for op), grad_b likewise; summed over broadcast batch dims.
MatmulGrads matmul_backward(const Tensor& a, const Tensor& b, const Tensor& grad_out, bool transpose_a = false,
                            bool transpose_b = false);

// y = x @ weight^T (+ bias): the Linear layer, weight [out_features, in_features].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// y = addend + x @ weight^T (+ bias), summed in f32 (f64 for f64) and rounded once: a decoder layer's residual
// add in the projection's epilogue (a prefill's o and down projections), where Hugging Face rounds the product
// and then the sum. addend has y's shape and dtype; undefined: linear.
Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& addend);
struct LinearGrads {
  Tensor grad_x;
  Tensor grad_weight;
  Tensor grad_bias;  // undefined without bias
};
LinearGrads linear_backward(const Tensor& x, const Tensor& weight, bool has_bias, const Tensor& grad_out);

}  // namespace microllm
