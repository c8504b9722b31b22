// Reductions over one dim, several dims, or all elements. f32 accumulation (f64 for f64).
// Results keep the input dtype (argmax: i64). keepdim keeps reduced dims with size 1.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm {

Tensor sum(const Tensor& x);  // all elements, rank 0
Tensor sum(const Tensor& x, const Dims& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim = false);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // index into the flattened tensor, rank 0
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

// Backward: grad_out has the reduced shape (with or without keepdim, as the forward was called).
Tensor sum_backward(const Tensor& grad_out, const Shape& input_shape, const Dims& dims, bool keepdim);
Tensor mean_backward(const Tensor& grad_out, const Shape& input_shape, const Dims& dims, bool keepdim);
// The gradient goes to the first maximal element (PyTorch's max(dim) rule).
Tensor max_backward(const Tensor& grad_out, const Tensor& x, int64_t dim, bool keepdim);
Tensor max_backward(const Tensor& grad_out, const Tensor& x);  // max over all elements

}  // namespace microllm
