#include "microllm/backend/backend.h"

#include <atomic>

#include "cpu/cpu_backend.h"
#include "environment.h"

namespace microllm {

#ifdef MICROLLM_WITH_CUDA
Backend& cuda_backend(int device);  // src/backend/cuda/cuda_backend.cu
#endif

namespace {
std::atomic<bool> g_allow_tf32{false};

using detail::FastPath;
using detail::path_disabled;

std::atomic<bool>& decode_gemv_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::gemv)};
  return flag;
}

std::atomic<bool>& deterministic_flag() {
  static std::atomic<bool> flag{detail::deterministic_from_environment()};
  return flag;
}

std::atomic<bool>& gemm_tuning_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::gemm_tuning)};
  return flag;
}

std::atomic<bool>& fused_swiglu_gemm_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::swiglu_gemm)};
  return flag;
}

std::atomic<bool>& flash_wgmma_flag() {
  static std::atomic<bool> flag{!path_disabled(FastPath::flash_wgmma)};
  return flag;
}
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
void set_deterministic_algorithms(bool deterministic) {
  deterministic_flag().store(deterministic, std::memory_order_relaxed);
}
bool deterministic_algorithms() { return deterministic_flag().load(std::memory_order_relaxed); }
void set_decode_gemv(bool enabled) { decode_gemv_flag().store(enabled, std::memory_order_relaxed); }
bool decode_gemv() { return decode_gemv_flag().load(std::memory_order_relaxed); }
void set_fused_swiglu_gemm(bool enabled) { fused_swiglu_gemm_flag().store(enabled, std::memory_order_relaxed); }
bool fused_swiglu_gemm() { return fused_swiglu_gemm_flag().load(std::memory_order_relaxed); }
void set_gemm_tuning(bool enabled) { gemm_tuning_flag().store(enabled, std::memory_order_relaxed); }
bool gemm_tuning() { return gemm_tuning_flag().load(std::memory_order_relaxed); }
void set_flash_wgmma(bool enabled) { flash_wgmma_flag().store(enabled, std::memory_order_relaxed); }
bool flash_wgmma() { return flash_wgmma_flag().load(std::memory_order_relaxed); }

bool Backend::folds_rms_norm_linear(int64_t, const Tensor&, bool) const { return false; }

void Backend::rms_norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                              const Tensor& weight, const Tensor& bias, bool swiglu, const Tensor& out,
                              const Tensor& h_out) {
  const Tensor normed = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor rstd = Tensor::empty({x.size(0)}, x.dtype() == DType::f64 ? DType::f64 : DType::f32, x.device());
  rms_norm(x, residual, norm_weight, eps, normed, h_out, rstd);
  if (swiglu) {
    linear_swiglu(normed, weight, bias, out);
  } else {
    matmul(normed, weight, /*transpose_a=*/false, /*transpose_b=*/true, bias, Tensor(), out);
  }
}

void Backend::linear_swiglu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const int64_t n = out.size(1);
  const Tensor gate_up = Tensor::empty({x.size(0), 2 * n}, x.dtype(), x.device());
  matmul(x, weight, /*transpose_a=*/false, /*transpose_b=*/true, bias, Tensor(), gate_up);
  this->swiglu(gate_up.narrow(1, 0, n), gate_up.narrow(1, n, n), out);
}

void Backend::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope_params,
                                     const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                     const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                     double scale, int64_t max_context, const Tensor& out) {
  // rope takes [B, T, H, D] with positions [B, T]: the N tokens as N sequences of one.
  const Tensor pos = positions.unsqueeze(1);
  const Tensor q_rot = Tensor::empty({q.size(0), 1, q.size(1), q.size(2)}, q.dtype(), q.device());
  const Tensor k_rot = Tensor::empty({k.size(0), 1, k.size(1), k.size(2)}, k.dtype(), k.device());
  rope(q.unsqueeze(1), pos, rope_params, /*inverse=*/false, q_rot);
  rope(k.unsqueeze(1), pos, rope_params, /*inverse=*/false, k_rot);
  paged_kv_write(k_pool, v_pool, k_rot.select(1, 0), v, slots);
  paged_attention(q_rot.select(1, 0), k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out);
}

void Backend::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const RopeParams& rope_params, const Tensor& k_pool,
                                               const Tensor& v_pool, const Tensor& slots, const Tensor& block_tables,
                                               const Tensor& seq_ids, const Tensor& positions, double scale,
                                               int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                               const Tensor& out) {
  const Tensor attention = Tensor::empty(q.shape(), q.dtype(), q.device());
  paged_decode_attention(q, k, v, rope_params, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                         max_context, attention);
  matmul(attention.reshape({q.size(0), q.size(1) * q.size(2)}), o_weight, /*transpose_a=*/false,
         /*transpose_b=*/true, Tensor(), addend, out);
}

void Backend::paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                  const RopeParams& rope_params, const Tensor& k_pool, const Tensor& v_pool,
                                  const Tensor& slots, const Tensor& q_out, const Tensor& k_out) {
  rope(q, positions, rope_params, /*inverse=*/false, q_out);
  rope(k, positions, rope_params, /*inverse=*/false, k_out);
  const int64_t rows = k.size(0) * k.size(1);
  paged_kv_write(k_pool, v_pool, k_out.reshape({rows, k.size(2), k.size(3)}), v.reshape({rows, v.size(2), v.size(3)}),
                 slots);
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

Backend& backend_for(Device device) {
  static const bool environment_checked = (detail::check_environment(), true);  // a mistake shows at the first op
  (void)environment_checked;
  if (device.is_cpu()) return cpu_backend();
#ifdef MICROLLM_WITH_CUDA
  return cuda_backend(device.index);
#else
  throw NotSupportedError("backend", str_cat("no backend for ", device,
                                             ": this build of microLLM has no CUDA support (configure with "
                                             "-DMICROLLM_CUDA=ON, e.g. the cuda-release preset)"));
#endif
}

}  // namespace microllm
