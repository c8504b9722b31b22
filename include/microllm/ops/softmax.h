// Softmax and log-softmax along one dim, computed stably (max subtracted first), f32 accumulation (f64
// for f64). Results are contiguous, in x's dtype. A row of only -inf gives NaN, as in torch.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
// From the forward's output y: dx = y * (g - sum(g * y))
Tensor softmax_backward(const Tensor& y, const Tensor& grad_out, int64_t dim = -1);
// From the forward's output y: dx = g - exp(y) * sum(g)
Tensor log_softmax_backward(const Tensor& y, const Tensor& grad_out, int64_t dim = -1);

}  // namespace microllm
