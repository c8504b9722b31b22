// Optimizer kernels as ops: multi-tensor AdamW and SGD steps that update parameters and moments in place,
// and gradient norms that stay on the device. The train layer (train/optimizer.h) builds on these.
//
// Every list has one entry per parameter and all tensors live on one device. Parameters are f32 and
// contiguous (updated in place), gradients f32 of the parameter's shape (any layout; non-contiguous ones
// are copied), moments f32 or bf16, contiguous, of the parameter's shape. grad_scale is undefined (no
// scaling) or a one-element f32 tensor on the device whose value multiplies every gradient: the clip
// factor of clip_coefficient(), read by the kernel, never by the host.
#pragma once

#include <vector>

#include "microllm/backend/backend.h"
#include "microllm/core/tensor.h"

namespace microllm {

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const std::vector<double>& weight_decay,
                const Tensor& grad_scale, const AdamWStep& step);
// momentum_buffer is empty when step.momentum is 0.
void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
              const Tensor& grad_scale, const SgdStep& step);

// f32 [n]: the sum of squares of each tensor (floating, any layout), the same bits on every run.
Tensor sum_squares(const std::vector<Tensor>& tensors);
// f32 rank 0: sqrt of the sum of squares over every element of every tensor (the global L2 norm).
Tensor global_norm(const std::vector<Tensor>& tensors);
// f32 rank 0 on norm's device: min(1, max_norm / (norm + 1e-6)), PyTorch's clip_grad_norm_ factor.
Tensor clip_coefficient(const Tensor& norm, double max_norm);

}  // namespace microllm
