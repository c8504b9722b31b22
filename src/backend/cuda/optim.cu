// CUDA optimizer kernels: fused multi-tensor AdamW and SGD steps, and the sum of squares of a list of
// tensors (for the global gradient norm).
//
// Multi-tensor apply: every tensor is cut into chunks of kChunk elements and one thread block handles one
// chunk. The pointers, sizes and per-tensor scalars of up to kMaxTensors tensors and the (tensor, chunk)
// of up to kMaxBlocks blocks travel as one kernel argument (TensorList, under the 4 KiB parameter limit),
// so a launch covers dozens of parameters without any host-to-device copy; a longer list takes a few
// launches. The per-step scalars (learning rate, bias corrections) are kernel arguments computed on the
// host from the step count, and the gradient scale (the clip factor) is read on the device from a
// one-element tensor, so nothing here waits for the GPU.
//
// Determinism: the updates are elementwise; sums go through fixed trees (a block per chunk writes its
// partial; a second kernel folds each tensor's partials in order), never atomics.
#include "../optim_math.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per block
constexpr int kMaxTensors = 36;
constexpr int kMaxBlocks = 320;
constexpr int kOptimThreads = 512;

// The tensors and blocks of one launch. N pointers per tensor (param, grad, moments...).
template <int N>
struct TensorList {
  void* ptrs[N][kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t first_chunk[kMaxTensors];  // sum_squares: index of this tensor's chunk 0 in the partials
  float scalar[kMaxTensors];         // AdamW: 1 - lr wd; SGD: wd
  uint16_t index[kMaxTensors];       // the tensor's index in the whole list (stochastic rounding)
  uint8_t block_tensor[kMaxBlocks];  // which tensor slot block b works on
  int32_t block_chunk[kMaxBlocks];   // and which of its chunks
};
static_assert(sizeof(TensorList<4>) <= 3800, "kernel parameters are limited to 4 KiB");

// Calls launch(list, blocks) for consecutive groups of (tensor, chunk) blocks covering every tensor.
// fill(list, slot, t) writes the pointers and scalars of tensor t into `slot`.
template <int N, typename Fill, typename LaunchFn>
void multi_tensor_apply(const std::vector<int64_t>& numel, Fill fill, LaunchFn launch) {
  TensorList<N> list{};
  int slot = 0, blocks = 0;
  int64_t chunk_base = 0;
  for (size_t t = 0; t < numel.size(); ++t) {
    const int64_t chunks = (numel[t] + kChunk - 1) / kChunk;
    if (chunks == 0) continue;
    fill(list, slot, t);
    list.numel[slot] = numel[t];
    list.first_chunk[slot] = chunk_base;
    list.index[slot] = static_cast<uint16_t>(t);
    for (int64_t c = 0; c < chunks; ++c) {
      list.block_tensor[blocks] = static_cast<uint8_t>(slot);
      list.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool tensors_full = slot + 1 == kMaxTensors && c + 1 == chunks;
      if (blocks == kMaxBlocks || tensors_full) {
        launch(list, blocks);
        blocks = 0;
        if (c + 1 < chunks) {  // the rest of this tensor continues in slot 0 of the next launch
          fill(list, 0, t);
          list.numel[0] = numel[t];
          list.first_chunk[0] = chunk_base;
          list.index[0] = static_cast<uint16_t>(t);
          slot = 0;
        } else {
          slot = -1;
        }
      }
    }
    chunk_base += chunks;
    ++slot;
  }
  if (blocks > 0) launch(list, blocks);
}

__device__ __forceinline__ float load_f(float v) { return v; }
__device__ __forceinline__ float load_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float load_f(__half v) { return __half2float(v); }
__device__ __forceinline__ double load_f(double v) { return v; }

// Chunk bounds of this block.
template <int N>
__device__ __forceinline__ void block_range(const TensorList<N>& list, int& slot, int64_t& begin, int64_t& end) {
  slot = list.block_tensor[blockIdx.x];
  begin = static_cast<int64_t>(list.block_chunk[blockIdx.x]) * kChunk;
  end = min(list.numel[slot], begin + kChunk);
}

template <typename M>
__global__ void __launch_bounds__(kOptimThreads)
    adamw_kernel(TensorList<4> list, const float* grad_scale, optim_math::AdamWScalars s) {
  int slot;
  int64_t begin, end;
  block_range(list, slot, begin, end);
  float* p = static_cast<float*>(list.ptrs[0][slot]);
  const float* g = static_cast<const float*>(list.ptrs[1][slot]);
  M* m = static_cast<M*>(list.ptrs[2][slot]);
  M* v = static_cast<M*>(list.ptrs[3][slot]);
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const float decay = list.scalar[slot];
  const uint64_t tensor = list.index[slot];
  // Four elements per thread per pass: 16-byte loads of p and g when aligned (chunks start at multiples
  // of kChunk, so the base pointers decide).
  const bool vector = (reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g)) % 16 == 0;
  for (int64_t base = begin + 4 * static_cast<int64_t>(threadIdx.x); base < end; base += 4 * blockDim.x) {
    if (vector && base + 4 <= end) {
      float4 pv = *reinterpret_cast<const float4*>(p + base);
      const float4 gv = *reinterpret_cast<const float4*>(g + base);
      float* pe = &pv.x;
      const float* ge = &gv.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t bits = optim_math::rounding_bits(s.seed, tensor, static_cast<uint64_t>(base + j));
        optim_math::adamw_element(pe[j], ge[j] * scale, m + base + j, v + base + j, decay, s, bits);
      }
      *reinterpret_cast<float4*>(p + base) = pv;
    } else {
      for (int64_t i = base; i < min(end, base + 4); ++i) {
        const uint32_t bits = optim_math::rounding_bits(s.seed, tensor, static_cast<uint64_t>(i));
        optim_math::adamw_element(p[i], g[i] * scale, m + i, v + i, decay, s, bits);
      }
    }
  }
}

template <typename M>
__global__ void __launch_bounds__(kOptimThreads)
    sgd_kernel(TensorList<3> list, const float* grad_scale, optim_math::SgdScalars s, bool has_momentum) {
  int slot;
  int64_t begin, end;
  block_range(list, slot, begin, end);
  float* p = static_cast<float*>(list.ptrs[0][slot]);
  const float* g = static_cast<const float*>(list.ptrs[1][slot]);
  M* buf = has_momentum ? static_cast<M*>(list.ptrs[2][slot]) : nullptr;
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const float wd = list.scalar[slot];
  const uint64_t tensor = list.index[slot];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const uint32_t bits = optim_math::rounding_bits(s.seed, tensor, static_cast<uint64_t>(i));
    optim_math::sgd_element(p[i], g[i] * scale, buf ? buf + i : nullptr, wd, s, bits);
  }
}

// One partial sum of squares per block (chunk), through a fixed tree.
template <typename T>
__global__ void __launch_bounds__(kOptimThreads) sum_squares_kernel(TensorList<1> list, float* partial) {
  __shared__ float scratch[32];
  int slot;
  int64_t begin, end;
  block_range(list, slot, begin, end);
  const T* x = static_cast<const T*>(list.ptrs[0][slot]);
  float sum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float value = static_cast<float>(load_f(x[i]));
    sum += value * value;
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partial[list.first_chunk[slot] + list.block_chunk[blockIdx.x]] = sum;
}

// out[t] = the partials of tensor t summed in order (f64), for the tensors of one group.
constexpr int kFoldTensors = 240;  // 16 bytes each: the list stays under the 4 KiB of kernel parameters
struct FoldList {
  int64_t first[kFoldTensors];
  int32_t count[kFoldTensors];
  int32_t out_index[kFoldTensors];
};
static_assert(sizeof(FoldList) <= 4000, "kernel parameters are limited to 4 KiB");

__global__ void fold_partials_kernel(FoldList list, int tensors, const float* partial, float* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tensors) return;
  double sum = 0;
  for (int32_t c = 0; c < list.count[t]; ++c) sum += partial[list.first[t] + c];
  out[list.out_index[t]] = static_cast<float>(sum);
}

// The moment storage type: f32 or bf16 (microllm::bf16, whose conversions optim_math.h uses on both sides).
template <typename Fn>
void visit_moment(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::bf16: return fn.template operator()<::microllm::bf16>();
    default: no_kernel(op, dtype);
  }
}

std::vector<int64_t> numels(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back(t.numel());
  return out;
}

const float* scale_ptr(const Tensor& grad_scale) {
  return grad_scale.defined() ? static_cast<const float*>(grad_scale.data_ptr()) : nullptr;
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                             const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                             const std::vector<double>& weight_decay, const Tensor& grad_scale, const AdamWStep& step) {
  OpScope scope("adamw_step", device_, detail::current_cuda_stream(device_));
  if (params.empty()) return;
  Launch launch(params[0]);
  const optim_math::AdamWScalars s = optim_math::adamw_scalars(step);
  const float* scale = scale_ptr(grad_scale);
  visit_moment(exp_avg[0].dtype(), "adamw_step", [&]<typename M>() {
    multi_tensor_apply<4>(
        numels(params),
        [&](TensorList<4>& list, int slot, size_t t) {
          list.ptrs[0][slot] = params[t].data_ptr();
          list.ptrs[1][slot] = grads[t].data_ptr();
          list.ptrs[2][slot] = exp_avg[t].data_ptr();
          list.ptrs[3][slot] = exp_avg_sq[t].data_ptr();
          list.scalar[slot] = static_cast<float>(1.0 - step.lr * weight_decay[t]);
        },
        [&](const TensorList<4>& list, int blocks) {
          adamw_kernel<M><<<blocks, kOptimThreads, 0, launch.stream>>>(list, scale, s);
          MICROLLM_CUDA_CHECK_LAUNCH();
        });
  });
}

void CudaBackend::sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                           const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
                           const Tensor& grad_scale, const SgdStep& step) {
  OpScope scope("sgd_step", device_, detail::current_cuda_stream(device_));
  if (params.empty()) return;
  Launch launch(params[0]);
  const optim_math::SgdScalars s = optim_math::sgd_scalars(step);
  const float* scale = scale_ptr(grad_scale);
  const bool has_momentum = !momentum_buffer.empty();
  visit_moment(has_momentum ? momentum_buffer[0].dtype() : DType::f32, "sgd_step", [&]<typename M>() {
    multi_tensor_apply<3>(
        numels(params),
        [&](TensorList<3>& list, int slot, size_t t) {
          list.ptrs[0][slot] = params[t].data_ptr();
          list.ptrs[1][slot] = grads[t].data_ptr();
          list.ptrs[2][slot] = has_momentum ? momentum_buffer[t].data_ptr() : nullptr;
          list.scalar[slot] = static_cast<float>(weight_decay[t]);
        },
        [&](const TensorList<3>& list, int blocks) {
          sgd_kernel<M><<<blocks, kOptimThreads, 0, launch.stream>>>(list, scale, s, has_momentum);
          MICROLLM_CUDA_CHECK_LAUNCH();
        });
  });
}

void CudaBackend::sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) {
  OpScope scope("sum_squares", device_, detail::current_cuda_stream(device_));
  if (tensors.empty()) return;
  Launch launch(out);
  const std::vector<int64_t> n = numels(tensors);
  std::vector<int64_t> first(n.size() + 1, 0);
  for (size_t t = 0; t < n.size(); ++t) first[t + 1] = first[t] + (n[t] + kChunk - 1) / kChunk;
  // One partial per chunk (at least one slot, so empty tensors still fold to 0).
  Tensor partial = Tensor::empty({std::max<int64_t>(first.back(), 1)}, DType::f32, out.device());
  float* partial_ptr = static_cast<float*>(partial.data_ptr());
  // Launches group tensors of one dtype; a mixed list takes a pass per dtype.
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    std::vector<int64_t> masked(n.size(), 0);
    bool any = false;
    for (size_t t = 0; t < n.size(); ++t) {
      if (tensors[t].dtype() == dtype) masked[t] = n[t], any = any || n[t] > 0;
    }
    if (!any) continue;
    visit_float(dtype, "sum_squares", [&]<typename T>() {
      multi_tensor_apply<1>(
          masked, [&](TensorList<1>& list, int slot, size_t t) { list.ptrs[0][slot] = tensors[t].data_ptr(); },
          [&](TensorList<1> list, int blocks) {
            // first_chunk counted only this dtype's tensors; use the global chunk offsets.
            for (int b = 0; b < kMaxTensors; ++b) list.first_chunk[b] = first[list.index[b]];
            sum_squares_kernel<T><<<blocks, kOptimThreads, 0, launch.stream>>>(list, partial_ptr);
            MICROLLM_CUDA_CHECK_LAUNCH();
          });
    });
  }
  for (size_t group = 0; group < n.size(); group += kFoldTensors) {
    FoldList list{};
    const int count = static_cast<int>(std::min<size_t>(kFoldTensors, n.size() - group));
    for (int i = 0; i < count; ++i) {
      list.first[i] = first[group + i];
      list.count[i] = static_cast<int32_t>(first[group + i + 1] - first[group + i]);
      list.out_index[i] = static_cast<int32_t>(group + i);
    }
    fold_partials_kernel<<<(count + 127) / 128, 128, 0, launch.stream>>>(list, count, partial_ptr,
                                                                         static_cast<float*>(out.data_ptr()));
    MICROLLM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace microllm
