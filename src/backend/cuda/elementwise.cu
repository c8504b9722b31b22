// CUDA elementwise kernels. One kernel shape serves every elementwise op: `count` inputs of type In,
// one output of type Out, a functor for the math (formulas from elementwise_math.h, shared with the
// CPU). Contiguous, 16-byte aligned operands take the vectorized path (16-byte loads per input);
// anything else (broadcast, transposed, sliced) takes the strided path.
#include "../elementwise_math.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

template <int N, typename T>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Vectorized: every operand contiguous; thread t handles elements [t*V, t*V+V).
template <typename Out, typename In, int NIN, int V, typename Fn>
__global__ void elementwise_contiguous(Out* __restrict__ out, const std::array<const In*, NIN> ins, int64_t n, Fn fn) {
  const int64_t packs = n / V;
  MICROLLM_GRID_STRIDE_LOOP(p, packs) {
    Pack<V, In> in[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) in[k] = reinterpret_cast<const Pack<V, In>*>(ins[k])[p];
    Pack<V, Out> result;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      In args[NIN];
#pragma unroll
      for (int k = 0; k < NIN; ++k) args[k] = in[k].v[j];
      result.v[j] = fn(args);
    }
    reinterpret_cast<Pack<V, Out>*>(out)[p] = result;
  }
  // The tail that does not fill a pack.
  for (int64_t i = packs * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    In args[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) args[k] = ins[k][i];
    out[i] = fn(args);
  }
}

// Strided: operand 0 of meta is the output, operands 1..NIN the inputs.
template <typename Out, typename In, int NIN, typename Fn>
__global__ void elementwise_strided(Out* __restrict__ out, const std::array<const In*, NIN> ins,
                                    StridedMeta<NIN + 1> meta, int64_t n, Fn fn) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[NIN + 1];
    meta.offsets(i, off);
    In args[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) args[k] = ins[k][off[k + 1]];
    out[off[0]] = fn(args);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// out = fn(inputs...) over out's shape; inputs are already expanded to it.
template <typename Out, typename In, int NIN, typename Fn>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, NIN>& inputs, Fn fn) {
  const int64_t n = out.numel();
  if (n == 0) return;
  Launch launch(out);
  std::array<Strides, NIN + 1> strides;
  std::array<const In*, NIN> ptrs;
  strides[0] = out.strides();
  bool aligned = aligned16(out.data_ptr());
  for (int k = 0; k < NIN; ++k) {
    strides[k + 1] = inputs[k]->strides();
    ptrs[k] = static_cast<const In*>(inputs[k]->data_ptr());
    aligned = aligned && aligned16(ptrs[k]);
  }
  const StridedMeta<NIN + 1> meta = make_strided_meta<NIN + 1>(out.shape(), strides);
  Out* dst = static_cast<Out*>(out.data_ptr());
  if (all_contiguous(meta) && aligned) {
    constexpr int V = 16 / sizeof(In) > 0 ? 16 / sizeof(In) : 1;
    elementwise_contiguous<Out, In, NIN, V><<<grid_for(n / V + 1), kThreads, 0, launch.stream>>>(dst, ptrs, n, fn);
  } else {
    elementwise_strided<Out, In, NIN><<<grid_for(n), kThreads, 0, launch.stream>>>(dst, ptrs, meta, n, fn);
  }
  MICROLLM_CUDA_CHECK_LAUNCH();
}

// ---- functors (device math in elementwise_math.h) ----
template <typename T>
struct UnaryFn {
  UnaryOp op;
  acc_t<T> alpha;
  __device__ T operator()(const T (&x)[1]) const { return from_acc<T>(math::unary_forward(op, to_acc(x[0]), alpha)); }
};

template <typename T>
struct UnaryBackwardFn {  // inputs: x, grad_out
  UnaryOp op;
  acc_t<T> alpha;
  __device__ T operator()(const T (&in)[2]) const {
    return from_acc<T>(to_acc(in[1]) * math::unary_derivative(op, to_acc(in[0]), alpha));
  }
};

// Floats compute in acc_t; integers in int64 (as on the CPU).
template <typename T>
using compute_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

template <typename T>
__device__ __forceinline__ compute_t<T> to_compute(T v) {
  if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(v);
  else return to_acc(v);
}

template <typename T>
struct BinaryArithFn {
  BinaryOp op;
  __device__ T operator()(const T (&in)[2]) const {
    const compute_t<T> r = math::binary_arith(op, to_compute(in[0]), to_compute(in[1]));
    if constexpr (std::is_integral_v<T>) return static_cast<T>(r);
    else return from_acc<T>(r);
  }
};

template <typename T>
struct CompareFn {
  BinaryOp op;
  __device__ uint8_t operator()(const T (&in)[2]) const {
    return math::binary_compare(op, to_compute(in[0]), to_compute(in[1])) ? 1 : 0;
  }
};

// where has a u8 condition beside two T inputs, so it has its own (strided) kernel.
template <typename T>
__global__ void where_kernel(T* __restrict__ out, const uint8_t* cond, const T* a, const T* b, StridedMeta<4> meta,
                             int64_t n) {
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[4];
    meta.offsets(i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::unary(UnaryOp op, const Tensor& x, double alpha, const Tensor& out) {
  OpScope scope(unary_op_name(op), device_, detail::current_cuda_stream(device_));
  visit_float(x.dtype(), unary_op_name(op), [&]<typename T>() {
    launch_elementwise<T, T, 1>(out, {&x}, UnaryFn<T>{op, static_cast<acc_t<T>>(alpha)});
  });
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, double alpha, const Tensor& grad_out,
                                 const Tensor& grad_x) {
  OpScope scope(unary_op_name(op), device_, detail::current_cuda_stream(device_));
  visit_float(x.dtype(), unary_op_name(op), [&]<typename T>() {
    launch_elementwise<T, T, 2>(grad_x, {&x, &grad_out}, UnaryBackwardFn<T>{op, static_cast<acc_t<T>>(alpha)});
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  OpScope scope(binary_op_name(op), device_, detail::current_cuda_stream(device_));
  visit_numeric(a.dtype(), binary_op_name(op), [&]<typename T>() {
    if (is_comparison(op)) {
      launch_elementwise<uint8_t, T, 2>(out, {&a, &b}, CompareFn<T>{op});
    } else {
      launch_elementwise<T, T, 2>(out, {&a, &b}, BinaryArithFn<T>{op});
    }
  });
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  OpScope scope("where", device_, detail::current_cuda_stream(device_));
  visit_numeric(a.dtype(), "where", [&]<typename T>() {
    const int64_t n = out.numel();
    if (n == 0) return;
    Launch launch(out);
    const StridedMeta<4> meta =
        make_strided_meta<4>(out.shape(), {out.strides(), cond.strides(), a.strides(), b.strides()});
    where_kernel<T><<<grid_for(n), kThreads, 0, launch.stream>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const uint8_t*>(cond.data_ptr()),
        static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()), meta, n);
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace microllm
