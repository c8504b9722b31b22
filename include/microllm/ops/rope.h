// Rotary position embedding (RoPE) on x [B, T, H, D] with explicit positions [B, T] or [T] (i32/i64).
// Frequencies: inv_freq[i] = theta^(-2i/D), then the "linear" or "llama3" rope scaling of Hugging Face;
// angle = position * inv_freq[i]. The layout picks which dims rotate together (split-half or interleaved).
#pragma once

#include <vector>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm {

Tensor rope(const Tensor& x, const Tensor& positions, const RopeParams& params);
// The rotation is orthogonal: the backward rotates the gradient by -angle.
Tensor rope_backward(const Tensor& grad_out, const Tensor& positions, const RopeParams& params);

// The D/2 inverse frequencies after scaling, computed in f32 in the order Hugging Face uses.
std::vector<float> rope_inv_freq(const RopeParams& params, int64_t head_dim);

}  // namespace microllm
