// A linear layer's weight as inference multiplies it: its storage format and the kernels that serve that format.
// Callers (generate::Runner) ask the weight to multiply, never look at a dtype: the one format today is dense
// (an f32, bf16 or f16 matrix [out, in], optionally a bias [out]); a quantized format (int8 or fp8 with scales,
// GGUF blocks) is another Format here with its own matmul and GEMV, and its callers do not change.
//
//   LinearWeight w = LinearWeight::dense(weight, bias);
//   Tensor y = w.linear(x);                                     // x @ weight^T + bias
//   auto [out, h] = w.norm_linear(x, residual, norm_weight, eps);
#pragma once

#include <cstdint>

#include "microllm/ops/norm_linear.h"

namespace microllm {

class LinearWeight {
 public:
  enum class Format : uint8_t { dense };

  LinearWeight() = default;
  // weight [out, in] (f32, bf16 or f16; contiguous), bias [out] in its dtype or undefined.
  static LinearWeight dense(Tensor weight, Tensor bias = Tensor());

  bool defined() const { return weight_.defined(); }
  Format format() const { return format_; }
  int64_t out_features() const { return weight_.size(0); }
  int64_t in_features() const { return weight_.size(1); }
  DType dtype() const { return weight_.dtype(); }  // the dtype of its inputs and outputs
  const Tensor& bias() const { return bias_; }
  // The matrix [out, in] of a dense weight, for fused kernels that read one (the paged decode attention's o
  // projection); undefined for other formats, whose callers take the unfused path.
  Tensor dense_matrix() const { return format_ == Format::dense ? weight_ : Tensor(); }

  // x [.., in] -> [.., out] = x @ W^T + bias; with an addend (x's shape but out wide) the sum is rounded once: a
  // residual add in the GEMM's epilogue (ops linear_add).
  Tensor linear(const Tensor& x, const Tensor& addend = Tensor()) const;
  // ops::rms_norm_linear with this weight: out = rms_norm(x' + residual) @ W^T + bias (the gated activation of its
  // two halves with a gate), h = x' + residual, x' = x or rms_norm(x, x_norm_weight).
  NormLinearResult norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                               GatedActivation gate = GatedActivation::none,
                               const Tensor& x_norm_weight = Tensor()) const;
  // Whether norm_linear over `rows` rows of input runs as one kernel (CUDA's decode GEMV): then a residual add
  // belongs there, else in the projection before it.
  bool folds_norm(int64_t rows, GatedActivation gate) const;

 private:
  Format format_ = Format::dense;
  Tensor weight_, bias_;
};

}  // namespace microllm
