// Cross-entropy over logits [N, V] (or [B, T, V], flattened) with integer targets; the mean over the
// targets that are not ignore_index (0 when all are ignored). f32 result whatever the logits' dtype.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

constexpr int64_t kIgnoreIndex = -100;

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = kIgnoreIndex);
// grad_loss: rank-0 f32 (the upstream gradient). Returns grad_logits in the logits' dtype and shape.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                              int64_t ignore_index = kIgnoreIndex);

}  // namespace microllm
