// CUDA attention: the dispatcher. Each call takes the first path that supports it:
//   forward:  decode (T <= 4: split keys, attention_decode.cu)
//          -> flash (bf16/f16, D 64/96/128/256, no mask: tensor cores; wgmma on an H100/H200 at D 64/128,
//             attention_flash_fwd_sm90.cu, else mma.sync, attention_flash_fwd.cu)
//          -> reference (any dtype, D, mask, layout: attention_reference.cu)
//   backward: flash (the same conditions but D 96, attention_flash_bwd.cu) -> reference.
// Each path takes a sliding window (keys j > q_offset + i - window): the flash kernels skip the tiles before it.
// The fast paths read q, k, v (and dO) with 16-byte loads: vector_ready() hands them a contiguous copy
// when a view has no unit stride along D. MICROLLM_DISABLE=fast-attention in the environment forces the
// reference path everywhere (for checking the fast paths against it).
// out may be any [B, Hq, T, D] view with a unit stride along D: ops::attention hands a token-major one
// ([B, T, Hq, D] in memory, what the output projection reads). The flash kernels write it in place; the other
// paths write a contiguous tensor that is then copied into it.
#include <cmath>

#include "../environment.h"
#include "attention_kernels.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "microllm/backend/kernel_choices.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels::attention {

Problem make_problem(const Tensor& q, const Tensor& k, const AttentionParams& params) {
  Problem p{};
  p.batch = q.size(0);
  p.q_heads = q.size(1);
  p.kv_heads = k.size(1);
  p.q_len = q.size(2);
  p.kv_len = k.size(2);
  p.head_dim = q.size(3);
  p.group = p.q_heads / std::max<int64_t>(p.kv_heads, 1);
  p.scale = params.scale != 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  p.causal = params.causal;
  p.q_offset = params.q_offset;
  // A window no query row reaches past (q_offset + T <= window) hides nothing: the plain causal problem.
  p.window = params.window > 0 && p.q_offset + p.q_len > params.window ? params.window : 0;
  return p;
}

Tensor vector_ready(const Tensor& t) {
  if (t.numel() == 0 || rows::rows_aligned16(t)) return t;
  Tensor c = t.contiguous();
  if (!rows::rows_aligned16(c)) c = t.clone();  // contiguous() returns t itself when t is contiguous but misaligned
  return c;
}

namespace {

// write(o) with o = out where `in_place` (the path writes out's strides) or out is contiguous; otherwise with a
// contiguous tensor, copied into out afterwards.
template <typename Write>
void write_into(const Tensor& out, bool in_place, Write write) {
  if (in_place || out.is_contiguous()) return write(out);
  const Tensor staged = Tensor::empty(out.shape(), out.dtype(), out.device());
  write(staged);
  Tensor(out).copy_(staged);  // a handle on the same storage
}

bool force_reference() {
  static const bool forced = detail::path_disabled(detail::FastPath::fast_attention);
  return forced;
}

}  // namespace
}  // namespace cuda_kernels::attention

using namespace cuda_kernels;

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  OpScope scope("attention", device_, detail::current_cuda_stream(device_));
  if (out.numel() == 0) return;  // no query rows (or no batch / heads): nothing to write
  Launch launch(out);
  namespace at = cuda_kernels::attention;
  const at::Problem p = at::make_problem(q, k, params);
  auto record = [&](const char* choice) {
    if (!recording_kernel_choices()) return;
    record_kernel_choice("attention",
                         "q " + std::to_string(q.size(0)) + "x" + std::to_string(q.size(1)) + "x" +
                             std::to_string(q.size(2)) + "x" + std::to_string(q.size(3)) + ", keys " +
                             std::to_string(k.size(2)),
                         choice);
  };
  if (!at::force_reference()) {
    if (at::decode_supported(p, q.dtype())) {
      record("decode kernel (a query row a CTA)");
      return at::write_into(out, false, [&](const Tensor& o) {
        at::decode_forward(p, q, k, v, mask, o, lse, launch.stream, launch.device);
      });
    }
    if (at::flash_supported(p, q.dtype(), mask.defined())) {
      record("flash attention");
      // Its epilogue stores 16-byte row pieces: out's rows must be aligned for them.
      return at::write_into(out, rows::rows_aligned16(out), [&](const Tensor& o) {
        at::flash_forward(p, q, k, v, o, lse, launch.stream, launch.device);
      });
    }
  }
  record("reference kernel");
  at::write_into(out, false, [&](const Tensor& o) { at::reference_forward(p, q, k, v, mask, o, lse, launch.stream); });
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                     const AttentionParams& params, const Tensor& out, const Tensor& lse,
                                     const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                                     const Tensor& grad_v) {
  OpScope scope("attention_backward", device_, detail::current_cuda_stream(device_));
  if (grad_q.numel() == 0 && grad_k.numel() == 0) return;
  Launch launch(grad_k.numel() > 0 ? grad_k : grad_q);
  namespace at = cuda_kernels::attention;
  const at::Problem p = at::make_problem(q, k, params);
  if (!at::force_reference() && at::flash_backward_supported(p, q.dtype(), mask.defined())) {
    at::flash_backward(p, q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, launch.stream, launch.device);
    return;
  }
  at::reference_backward(p, q, k, v, mask, lse, grad_out, grad_q, grad_k, grad_v, launch.stream);
}

}  // namespace microllm
