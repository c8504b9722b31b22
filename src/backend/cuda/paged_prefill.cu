// CUDA paged_rope_kv_write (include/microllm/ops/paged_attention.h): a prefill chunk's rotary embedding and KV
// cache write in one kernel. The composition is two kernels of scalar 2-byte accesses (rope.cu's thread per
// (token, pair), paged_attention.cu's thread per element) far from copy bandwidth (docs/perf/kernels.md#paged-prefill);
// here a CTA takes a token: its threads turn the sine and cosine of each pair once into shared memory, then move
// the token's q, k and v rows in 16-byte vectors, writing the turned q and k (the attention's inputs) and the turned
// k and v rows of the token's cache slot.
//
// The arithmetic is rope.cu's (rope.cuh: the angle's product and each turn's products rounded on their own), so
// the outputs equal the composition bit for bit. Only the split-half layout (pair i is dims i and i + D/2, what
// Hugging Face's rotate_half gives) and 16-byte aligned rows take the kernel; the rest runs the composition.
#include <algorithm>
#include <type_traits>

#include "../../core/cuda/device_errors.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rope.cuh"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels::paged_prefill {
namespace {

using detail::DeviceErrorCode;
using detail::report_device_error;
using rows::kPack;
using rows::rows_aligned16;

constexpr int kThreadsPerToken = 128;
constexpr int kMaxHalf = 128;  // head dims up to 256
using Freq = rotary::InvFreq<float, kMaxHalf>;

struct Args {
  const void* q;  // [B, T, Hq, D] at q_stride (batch, token, head), unit stride along D; k, v the same with Hkv
  const void* k;
  const void* v;
  int64_t q_stride[3], k_stride[3], v_stride[3];
  const void* positions;  // [B, T] at pos_stride
  int64_t pos_stride[2];
  void* q_out;  // [B, T, Hq, D] contiguous
  void* k_out;  // [B, T, Hkv, D] contiguous
  void* k_pool;  // [blocks, block_size, Hkv, D] at pool_stride (block, row, head), unit stride along D
  void* v_pool;
  int64_t k_pool_stride[3], v_pool_stride[3];
  const int32_t* slots;  // [B * T] at slot_stride
  int64_t slot_stride;
  int64_t tokens, n_slots;
  int seq, q_heads, kv_heads, dim, block_size;
  uint64_t* error_word;
};

// The V = kPack<T> elements at p (16 bytes, aligned), and a store of them.
template <typename T>
using Vec = rows::Pack<kPack<T>, T>;
template <typename T>
__device__ __forceinline__ Vec<T> load(const T* p) {
  return *reinterpret_cast<const Vec<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store(T* p, const Vec<T>& x) {
  *reinterpret_cast<Vec<T>*>(p) = x;
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreadsPerToken) rope_kv_write_kernel(const Args a, const Freq freq) {
  constexpr int V = kPack<T>;
  __shared__ float s_cos[kMaxHalf], s_sin[kMaxHalf];
  const int half = a.dim / 2, vecs = half / V;  // vectors of pairs per head half
  wait_for_prior_grids();  // launched chained in a captured prefill: q, k, v come from the GEMM before
  chain_next_grids();
  for (int64_t token = blockIdx.x; token < a.tokens; token += gridDim.x) {
    const int64_t b = token / a.seq, t = token % a.seq;
    const auto position = static_cast<float>(static_cast<int64_t>(
        static_cast<const P*>(a.positions)[b * a.pos_stride[0] + t * a.pos_stride[1]]));
    for (int i = threadIdx.x; i < half; i += blockDim.x) rotary::angle_sin_cos(position, freq.v[i], &s_sin[i], &s_cos[i]);
    int64_t slot = a.slots[token * a.slot_stride];
    if (slot >= a.n_slots) {
      if (threadIdx.x == 0) report_device_error(a.error_word, DeviceErrorCode::paged_slot, slot);
      slot = -1;
    }
    const int64_t block = slot / a.block_size, row = slot % a.block_size;
    __syncthreads();
    // The q and k heads: vector c of head h holds pairs [c V, c V + V), its two halves V elements each.
    for (int item = threadIdx.x; item < (a.q_heads + a.kv_heads) * vecs; item += blockDim.x) {
      const int h = item / vecs, c = item % vecs;
      const bool is_q = h < a.q_heads;
      const int head = is_q ? h : h - a.q_heads;
      const T* src = is_q ? static_cast<const T*>(a.q) + b * a.q_stride[0] + t * a.q_stride[1] + head * a.q_stride[2]
                          : static_cast<const T*>(a.k) + b * a.k_stride[0] + t * a.k_stride[1] + head * a.k_stride[2];
      const Vec<T> lo = load(src + c * V), hi = load(src + half + c * V);
      Vec<T> out_lo, out_hi;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float y1, y2;
        rotary::turn(to_acc(lo.v[j]), to_acc(hi.v[j]), s_cos[c * V + j], s_sin[c * V + j], y1, y2);
        out_lo.v[j] = from_acc<T>(y1);
        out_hi.v[j] = from_acc<T>(y2);
      }
      T* dst = is_q ? static_cast<T*>(a.q_out) + (token * a.q_heads + head) * a.dim
                    : static_cast<T*>(a.k_out) + (token * a.kv_heads + head) * a.dim;
      store(dst + c * V, out_lo);
      store(dst + half + c * V, out_hi);
      if (!is_q && slot >= 0) {
        T* cached = static_cast<T*>(a.k_pool) + block * a.k_pool_stride[0] + row * a.k_pool_stride[1] +
                    head * a.k_pool_stride[2];
        store(cached + c * V, out_lo);
        store(cached + half + c * V, out_hi);
      }
    }
    if (slot >= 0) {
      for (int item = threadIdx.x; item < a.kv_heads * 2 * vecs; item += blockDim.x) {
        const int head = item / (2 * vecs), c = item % (2 * vecs);
        const T* src = static_cast<const T*>(a.v) + b * a.v_stride[0] + t * a.v_stride[1] + head * a.v_stride[2];
        T* cached = static_cast<T*>(a.v_pool) + block * a.v_pool_stride[0] + row * a.v_pool_stride[1] +
                    head * a.v_pool_stride[2];
        store(cached + c * V, load(src + c * V));
      }
    }
    __syncthreads();  // the next token's sines and cosines overwrite these
  }
}

// The kernel's shapes: split-half pairs, whole 16-byte vectors in each half of a head, every row it moves aligned.
bool fused_fits(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope, const Tensor& k_pool,
                const Tensor& v_pool) {
  const int64_t dim = q.size(3), per16 = 16 / static_cast<int64_t>(q.element_size());
  return rope.layout == RopeLayout::split_half && q.dtype() != DType::f64 && dim / 2 <= kMaxHalf &&
         (dim / 2) % per16 == 0 && q.size(0) * q.size(1) < (int64_t{1} << 31) && rows_aligned16(q) &&
         rows_aligned16(k) && rows_aligned16(v) && rows_aligned16(k_pool) && rows_aligned16(v_pool);
}

}  // namespace
}  // namespace cuda_kernels::paged_prefill

using namespace cuda_kernels;

void CudaFusions::paged_rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                      const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                      const Tensor& slots, const Tensor& q_out, const Tensor& k_out) {
  namespace pp = paged_prefill;
  if (!pp::fused_fits(q, k, v, rope, k_pool, v_pool)) {
    return Fusions::paged_rope_kv_write(q, k, v, positions, rope, k_pool, v_pool, slots, q_out, k_out);
  }
  OpScope scope("paged_rope_kv_write", device_, detail::current_cuda_stream(device_));
  Launch launch(q_out);
  pp::Args a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  rows::strides3(q, a.q_stride);
  rows::strides3(k, a.k_stride);
  rows::strides3(v, a.v_stride);
  a.positions = positions.data_ptr();
  a.pos_stride[0] = positions.stride(0);
  a.pos_stride[1] = positions.stride(1);
  a.q_out = q_out.data_ptr();
  a.k_out = k_out.data_ptr();
  a.k_pool = k_pool.data_ptr();
  a.v_pool = v_pool.data_ptr();
  rows::strides3(k_pool, a.k_pool_stride);
  rows::strides3(v_pool, a.v_pool_stride);
  a.slots = slots.data<int32_t>();
  a.slot_stride = slots.stride(0);
  a.tokens = q.size(0) * q.size(1);
  a.n_slots = k_pool.size(0) * k_pool.size(1);
  a.seq = static_cast<int>(q.size(1));
  a.q_heads = static_cast<int>(q.size(2));
  a.kv_heads = static_cast<int>(k.size(2));
  a.dim = static_cast<int>(q.size(3));
  a.block_size = static_cast<int>(k_pool.size(1));
  a.error_word = detail::cuda_error_word(device_);
  const pp::Freq freq = rotary::inv_freq_arg<float, pp::kMaxHalf>(rope, q.size(3));
  const auto grid = static_cast<unsigned>(std::min<int64_t>(a.tokens, int64_t{1} << 20));
  visit_float(q.dtype(), "paged_rope_kv_write", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      if (positions.dtype() == DType::i32) {
        launch_chained(pp::rope_kv_write_kernel<T, int32_t>, grid, pp::kThreadsPerToken, 0, launch.stream,
                       launch.device, a, freq);
      } else {
        launch_chained(pp::rope_kv_write_kernel<T, int64_t>, grid, pp::kThreadsPerToken, 0, launch.stream,
                       launch.device, a, freq);
      }
    }
  });
}

}  // namespace microllm
