// Cross-entropy over logits [N, V] (or [..., V], flattened) with integer targets [N] (or [...]); the mean
// over the targets that are not ignore_index, as torch.nn.functional.cross_entropy(reduction='mean'),
// except that all targets ignored gives 0 (torch: NaN). The loss is rank 0, f32 (f64 for f64 logits, so
// f64 finite differences can check the gradient). Targets outside [0, V) other than ignore_index throw.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

constexpr int64_t kIgnoreIndex = -100;

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = kIgnoreIndex);
// grad_loss: rank 0, floating (the upstream gradient). Returns grad_logits in the logits' dtype and shape.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                              int64_t ignore_index = kIgnoreIndex);

}  // namespace microllm
