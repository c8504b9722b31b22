// Gathering, scattering, joining and ranking.
#pragma once

#include <vector>

#include "microllm/core/tensor.h"

namespace microllm {

// weight [V, D], ids (i32/i64) of any shape -> [*ids.shape, D]. Ids outside [0, V) throw IndexError.
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t vocab_size);

// Joins along `dim`; all other dims, the dtype and the device must agree.
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> concat_backward(const Tensor& grad_out, const std::vector<int64_t>& sizes, int64_t dim);
// Views (no copy) of consecutive pieces of the given sizes along `dim`; the sizes must add up.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor split_backward(const std::vector<Tensor>& grad_outs, int64_t dim);  // concat

struct TopK {
  Tensor values;   // [..., k], descending
  Tensor indices;  // [..., k], i64; ties: the lower index first
};
TopK topk(const Tensor& x, int64_t k);  // along the last dim
Tensor topk_backward(const Tensor& grad_values, const Tensor& indices, const Shape& input_shape);

// out = x with out[..., index[..., j, ...], ...] += src[..., j, ...] along dim (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace microllm
