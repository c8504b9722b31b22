// CUDA SwiGLU and its backward, and GeGLU (a fusion: Fusions::geglu), in the shape of elementwise.cu: NIN inputs and
// NOUT outputs of one storage type, the math in f32 (f64 for f64) with the CPU's formulas. Contiguous, 16-byte aligned
// operands move in 16-byte vectors; anything else (transposed, sliced, permuted) takes the strided path.
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

// fn on each of the V elements of one pack of every input, in f32 (f64 for f64).
template <typename T, int NIN, int NOUT, int V, typename Fn>
__device__ __forceinline__ void apply_to_packs(const Pack<V, T> (&in)[NIN], Pack<V, T> (&result)[NOUT], const Fn& fn) {
  using A = acc_t<T>;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    A args[NIN], res[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) args[k] = to_acc(in[k].v[j]);
    fn(args, res);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) result[k].v[j] = from_acc<T>(res[k]);
  }
}

// Vectorized: every operand contiguous and aligned; thread t handles elements [t*V, t*V+V).
template <typename T, int NIN, int NOUT, int V, typename Fn>
__global__ void gated_contiguous(const std::array<T*, NOUT> outs, const std::array<const T*, NIN> ins, int64_t n,
                                 Fn fn) {
  using A = acc_t<T>;
  const int64_t packs = n / V;
  wait_for_prior_grids();  // launched chained (a decode step's SwiGLU reads the GEMM before it)
  chain_next_grids();
  MICROLLM_GRID_STRIDE_LOOP(p, packs) {
    Pack<V, T> in[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) in[k] = reinterpret_cast<const Pack<V, T>*>(ins[k])[p];
    Pack<V, T> result[NOUT];
    apply_to_packs(in, result, fn);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) reinterpret_cast<Pack<V, T>*>(outs[k])[p] = result[k];
  }
  // The tail that does not fill a pack.
  for (int64_t i = packs * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A args[NIN], res[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) args[k] = to_acc(ins[k][i]);
    fn(args, res);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) outs[k][i] = from_acc<T>(res[k]);
  }
}

// Row-strided: every operand is `rows` rows of `cols` contiguous elements, row_stride[k] apart, with 16-byte
// aligned rows (the two halves of a fused gate_up product at prefill: row stride 2 * cols); 16-byte packs
// along each row. Operands 0..NOUT-1 of row_stride are the outputs.
template <typename T, int NIN, int NOUT, int V, typename Fn>
__global__ void gated_rows(const std::array<T*, NOUT> outs, const std::array<const T*, NIN> ins,
                           const std::array<int64_t, NIN + NOUT> row_stride, int64_t rows, int64_t cols, Fn fn) {
  const int64_t packs_per_row = cols / V;
  wait_for_prior_grids();
  chain_next_grids();
  MICROLLM_GRID_STRIDE_LOOP(p, rows * packs_per_row) {
    const int64_t row = p / packs_per_row, col = p % packs_per_row * V;
    Pack<V, T> in[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k)
      in[k] = *reinterpret_cast<const Pack<V, T>*>(ins[k] + row * row_stride[NOUT + k] + col);
    Pack<V, T> result[NOUT];
    apply_to_packs(in, result, fn);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) *reinterpret_cast<Pack<V, T>*>(outs[k] + row * row_stride[k] + col) = result[k];
  }
}

// Strided: operands 0..NOUT-1 of meta are the outputs, NOUT.. the inputs.
template <typename T, int NIN, int NOUT, typename Fn>
__global__ void gated_strided(const std::array<T*, NOUT> outs, const std::array<const T*, NIN> ins,
                              const StridedMeta<NIN + NOUT> meta, int64_t n, Fn fn) {
  using A = acc_t<T>;
  MICROLLM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[NIN + NOUT];
    meta.offsets(i, off);
    A args[NIN], res[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) args[k] = to_acc(ins[k][off[NOUT + k]]);
    fn(args, res);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) outs[k][off[k]] = from_acc<T>(res[k]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// outputs = fn(inputs) over the outputs' shape (all operands share it).
template <typename T, int NIN, int NOUT, typename Fn>
void launch_gated(const std::array<const Tensor*, NOUT>& outputs, const std::array<const Tensor*, NIN>& inputs, Fn fn) {
  const int64_t n = outputs[0]->numel();
  if (n == 0) return;
  Launch launch(*outputs[0]);
  std::array<Strides, NIN + NOUT> strides;
  std::array<T*, NOUT> outs;
  std::array<const T*, NIN> ins;
  bool aligned = true;
  for (int k = 0; k < NOUT; ++k) {
    strides[k] = outputs[k]->strides();
    outs[k] = static_cast<T*>(outputs[k]->data_ptr());
    aligned = aligned && aligned16(outs[k]);
  }
  for (int k = 0; k < NIN; ++k) {
    strides[NOUT + k] = inputs[k]->strides();
    ins[k] = static_cast<const T*>(inputs[k]->data_ptr());
    aligned = aligned && aligned16(ins[k]);
  }
  const StridedMeta<NIN + NOUT> meta = make_strided_meta<NIN + NOUT>(outputs[0]->shape(), strides);
  constexpr int V = 16 / sizeof(T);
  // The merged layout as rows of whole, aligned packs: [rows, cols] with a unit stride along cols.
  std::array<int64_t, NIN + NOUT> row_stride{};
  bool rows_of_packs = aligned && meta.rank == 2 && meta.shape[1] % V == 0;
  for (int k = 0; k < NIN + NOUT && rows_of_packs; ++k) {
    row_stride[k] = meta.strides[k][0];
    rows_of_packs = meta.strides[k][1] == 1 && row_stride[k] % V == 0;
  }
  if (all_contiguous(meta) && aligned) {
    launch_chained(gated_contiguous<T, NIN, NOUT, V, Fn>, grid_for(n / V + 1), kThreads, 0, launch.stream,
                   launch.device, outs, ins, n, fn);
  } else if (rows_of_packs) {
    launch_chained(gated_rows<T, NIN, NOUT, V, Fn>, grid_for(n / V), kThreads, 0, launch.stream, launch.device, outs,
                   ins, row_stride, meta.shape[0], meta.shape[1], fn);
  } else {
    gated_strided<T, NIN, NOUT><<<grid_for(n), kThreads, 0, launch.stream>>>(outs, ins, meta, n, fn);
  }
  MICROLLM_CUDA_CHECK_LAUNCH();
}

// out = silu(gate) * up. Inputs: gate, up.
struct SwigluFn {
  template <typename A>
  __device__ void operator()(const A (&in)[2], A (&out)[1]) const {
    out[0] = math::swiglu(in[0], in[1]);
  }
};

// out = round(gelu_tanh(gate)) * up: the gelu_tanh and mul ops' arithmetic and rounding (Fusions::geglu). Inputs: gate,
// up.
template <typename T>
struct GegluFn {
  template <typename A>
  __device__ void operator()(const A (&in)[2], A (&out)[1]) const {
    out[0] = math::geglu(in[0], in[1], [](A v) { return round_to<T>(v); });
  }
};

// d/dg = dy * up * s (1 + g (1 - s)), d/du = dy * g * s with s = sigmoid(g). Inputs: gate, up, grad_out;
// outputs: grad_gate, grad_up.
struct SwigluBackwardFn {
  template <typename A>
  __device__ void operator()(const A (&in)[3], A (&out)[2]) const {
    const A g = in[0], u = in[1], dy = in[2];
    const A s = math::sigmoid(g);
    out[0] = dy * u * s * (A(1) + g * (A(1) - s));
    out[1] = dy * g * s;
  }
};

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  OpScope scope("swiglu", device_, detail::current_cuda_stream(device_));
  visit_float(gate.dtype(), "swiglu", [&]<typename T>() { launch_gated<T, 2, 1>({&out}, {&gate, &up}, SwigluFn{}); });
}

void CudaFusions::geglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  OpScope scope("geglu", device_, detail::current_cuda_stream(device_));
  visit_float(gate.dtype(), "geglu", [&]<typename T>() { launch_gated<T, 2, 1>({&out}, {&gate, &up}, GegluFn<T>{}); });
}

void CudaBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out, const Tensor& grad_gate,
                                  const Tensor& grad_up) {
  OpScope scope("swiglu_backward", device_, detail::current_cuda_stream(device_));
  visit_float(gate.dtype(), "swiglu_backward", [&]<typename T>() {
    launch_gated<T, 3, 2>({&grad_gate, &grad_up}, {&gate, &up, &grad_out}, SwigluBackwardFn{});
  });
}

}  // namespace microllm
