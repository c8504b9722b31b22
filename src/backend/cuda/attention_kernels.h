// The CUDA attention family (internal header): the resolved problem every path shares, and the host
// launchers of the four paths that CudaBackend::attention / attention_backward choose between
// (attention.cu): decode (few query rows, split keys), flash (bf16/f16 tensor cores, no mask)
// and the reference (everything else, every dtype). Every path honours a sliding window.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "microllm/backend/kernel_params.h"
#include "microllm/backend/portability.h"
#include "microllm/core/tensor.h"

namespace microllm::cuda_kernels::attention {

// The visibility rule of every path (the key bound and the mask are each path's own): query row i, at position
// q_offset + i, sees key j when causal allows it (j <= q_offset + i) and a sliding window does (j > q_offset + i -
// window; window 0: none). I: the path's index type.
template <typename I>
MICROLLM_HD inline bool sees_key(bool causal, I q_offset, I window, I i, I j) {
  return (!causal || j <= q_offset + i) && (window == 0 || j > q_offset + i - window);
}

// q [B, Hq, T, D], k and v [B, Hkv, S, D]: sizes and the visibility rule of every path.
struct Problem {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;
  int64_t group;     // query heads per kv head: query head h reads kv head h / group
  double scale;      // params.scale, or 1 / sqrt(D)
  bool causal;
  int64_t q_offset;  // query i sees keys j <= q_offset + i when causal
  int64_t window;    // and j > q_offset + i - window when window > 0 (sliding window; 0 when it hides no key)
};

Problem make_problem(const Tensor& q, const Tensor& k, const AttentionParams& params);

// ---- reference (attention_reference.cu): any dtype, layout, head dim and mask ----
void reference_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       const Tensor& out, const Tensor& lse, cudaStream_t stream);
void reference_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                        const Tensor& grad_v, cudaStream_t stream);

// ---- flash (attention_flash_fwd.cu, attention_flash_bwd.cu): bf16/f16, no mask; D 64, 128 or 256, and 96
// forward only ----
bool flash_supported(const Problem& p, DType dtype, bool has_mask);
bool flash_backward_supported(const Problem& p, DType dtype, bool has_mask);
void flash_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, cudaStream_t stream, int device);
// Whether flash_forward on `device` runs the Hopper kernel (wgmma, attention_flash_fwd_sm90.cu) rather than the
// portable mma.sync one: an sm_90 GPU, a build with sm_90a machine code, and set_flash_wgmma on (and, per call,
// a positive scale: flash_forward checks that).
bool flash_forward_uses_wgmma(int device);
void flash_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                    const Tensor& grad_v, cudaStream_t stream, int device);

// ---- decode (attention_decode.cu): T <= 4, bf16/f16/f32, D <= 256 a multiple of 8, mask allowed ----
bool decode_supported(const Problem& p, DType dtype);
void decode_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                    const Tensor& out, const Tensor& lse, cudaStream_t stream, int device);

// A view of a [B, H, L, D] operand that the fast kernels read with 16-byte loads: unit stride along D,
// 16-byte aligned start and outer strides a multiple of 16 bytes. `t` itself when it already is, else a
// contiguous copy (made on the current stream).
Tensor vector_ready(const Tensor& t);

}  // namespace microllm::cuda_kernels::attention
