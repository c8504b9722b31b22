// CUDA reductions along one dim (sum, mean, max, min; integers compute in int64) and argmax.
//
// Each output element reduces one line of x (the line's n elements `stride` apart). Two kernel shapes:
// - rows: the reduced dim is unit-stride and long (n > kShortLine): a block per line, 16-byte packs when
//   the line is aligned, a fixed-order tree in shared memory;
// - columns: the reduced dim is strided, or short: 32 adjacent lines per block (coalesced when adjacent
//   lines are adjacent in memory, e.g. a sum over dim 0), blockDim.y threads splitting each line.
// When there are too few lines to fill the GPU, long lines are cut into `splits` chunks whose partial
// states go to a scratch buffer and a third kernel folds them in order. Every order is fixed, so results
// are the same on every run. max/min propagate NaN; argmax takes the first maximum, NaN counting as the
// maximum (as on the CPU).
#include <limits>

#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels {
namespace {

using rows::ceil_div;

constexpr int64_t kShortLine = 32;    // lines this short take the column kernel, one thread per line
constexpr int kRowThreads = 256;      // the row kernel's largest block
constexpr int kColumnLines = 32;      // lines per column-kernel block (blockDim.x)
constexpr int kColumnSplit = 16;      // threads per line in the column kernel (blockDim.y) for long lines
constexpr int64_t kFillBlocks = 512;  // split lines until about this many blocks run
constexpr unsigned kMaxBlocks = 1u << 20;

// Floats compute in acc_t; integers in int64 (as on the CPU).
template <typename T>
using compute_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

template <typename T>
__device__ __forceinline__ compute_t<T> to_compute(T v) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<int64_t>(v);
  else
    return to_acc(v);
}

template <typename C>
__device__ __forceinline__ C lowest() {
  if constexpr (std::is_integral_v<C>)
    return std::numeric_limits<C>::lowest();
  else
    return -static_cast<C>(INFINITY);
}

template <typename C>
__device__ __forceinline__ C highest() {
  if constexpr (std::is_integral_v<C>)
    return std::numeric_limits<C>::max();
  else
    return static_cast<C>(INFINITY);
}

template <typename C>
__device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_integral_v<C>)
    return false;
  else
    return v != v;
}

// sum / mean / max / min. State: the running value.
template <typename T, ReduceOp kOp>
struct ReduceFn {
  using State = compute_t<T>;
  using Out = T;
  __device__ State identity() const {
    if constexpr (kOp == ReduceOp::max)
      return lowest<State>();
    else if constexpr (kOp == ReduceOp::min)
      return highest<State>();
    else
      return State(0);
  }
  __device__ State make(T v, int64_t) const { return to_compute(v); }
  __device__ State combine(State a, State b) const {
    if constexpr (kOp == ReduceOp::sum || kOp == ReduceOp::mean) {
      return a + b;
    } else {
      if (is_nan(a)) return a;  // NaN propagates
      if (is_nan(b)) return b;
      if constexpr (kOp == ReduceOp::max)
        return b > a ? b : a;
      else
        return b < a ? b : a;
    }
  }
  __device__ void write(T* out, State s, int64_t n) const {
    if constexpr (kOp == ReduceOp::mean) {
      if constexpr (std::is_integral_v<T>)
        s = n > 0 ? s / n : 0;  // unreachable: the ops layer rejects it
      else
        s = n > 0 ? s / static_cast<State>(n) : static_cast<State>(NAN);
    }
    if constexpr (std::is_integral_v<T>)
      *out = static_cast<T>(s);
    else
      *out = from_acc<T>(s);
  }
};

// argmax. State: (value, index); combine picks the first maximum under "NaN is largest, ties go to the
// lower index", a total order, so any grouping of the fold gives the CPU's answer.
template <typename T>
struct ArgmaxFn {
  struct State {
    compute_t<T> value;
    int64_t index;
  };
  using Out = int64_t;
  __device__ State identity() const { return {lowest<compute_t<T>>(), std::numeric_limits<int64_t>::max()}; }
  __device__ State make(T v, int64_t i) const { return {to_compute(v), i}; }
  __device__ State combine(State a, State b) const {
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.index <= b.index ? a : b;
  }
  __device__ void write(int64_t* out, State s, int64_t) const { *out = s.index; }
};

// Where a line lives: meta operand 0 is the output, operand 1 the line's first element in x.
struct Lines {
  StridedMeta<2> meta;
  int64_t count;   // number of lines (output elements)
  int64_t n;       // elements per line
  int64_t stride;  // between a line's elements
  int64_t chunk;   // elements per split
  int splits;      // chunks per line (1: no scratch, the kernel writes the output)
};

// Tree reduction over `count` (a power of two) states in shared memory, in a fixed order.
template <typename Fn, typename State>
__device__ __forceinline__ void tree_reduce(State* values, int tid, int count, const Fn& fn) {
  for (int half = count / 2; half > 0; half /= 2) {
    if (tid < half) values[tid] = fn.combine(values[tid], values[tid + half]);
    __syncthreads();
  }
}

// A block (blockDim.x a power of two <= kRowThreads) per (line, split) of unit-stride lines.
template <typename T, typename Fn>
__global__ void __launch_bounds__(kRowThreads)
    reduce_rows_kernel(const T* __restrict__ x, typename Fn::Out* __restrict__ out,
                       typename Fn::State* __restrict__ partial, Lines lines, Fn fn) {
  using State = typename Fn::State;
  __shared__ alignas(16) unsigned char raw[kRowThreads * sizeof(State)];
  State* values = reinterpret_cast<State*>(raw);
  const int64_t work = lines.count * lines.splits;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t line = w / lines.splits;
    const int64_t split = w % lines.splits;
    int64_t off[2];
    lines.meta.offsets(line, off);
    const int64_t begin = split * lines.chunk;
    const int64_t len = std::min(lines.n - begin, lines.chunk);
    State s = fn.identity();
    rows::visit_row(x + off[1] + begin, len, int64_t{1}, threadIdx.x, blockDim.x,
                    [&](int64_t i, const T* v, int count) {
#pragma unroll
                      for (int j = 0; j < rows::kPack<T> && j < count; ++j)
                        s = fn.combine(s, fn.make(v[j], begin + i + j));
                    });
    values[threadIdx.x] = s;
    __syncthreads();
    tree_reduce(values, threadIdx.x, blockDim.x, fn);
    if (threadIdx.x == 0) {
      if (lines.splits == 1)
        fn.write(out + off[0], values[0], lines.n);
      else
        partial[w] = values[0];
    }
    __syncthreads();  // values[0] is read before the next line overwrites it
  }
}

// Blocks of (kColumnLines, Y): threadIdx.x picks a line, threadIdx.y strides through its chunk;
// blockIdx.y is the split.
template <typename T, typename Fn>
__global__ void __launch_bounds__(kColumnLines* kColumnSplit)
    reduce_columns_kernel(const T* __restrict__ x, typename Fn::Out* __restrict__ out,
                          typename Fn::State* __restrict__ partial, Lines lines, Fn fn) {
  using State = typename Fn::State;
  __shared__ alignas(16) unsigned char raw[kColumnSplit * kColumnLines * sizeof(State)];
  State* values = reinterpret_cast<State*>(raw);  // [y][x]
  const int64_t line = blockIdx.x * static_cast<int64_t>(kColumnLines) + threadIdx.x;
  const int64_t split = blockIdx.y;
  State s = fn.identity();
  int64_t off[2] = {0, 0};
  if (line < lines.count) {
    lines.meta.offsets(line, off);
    const T* src = x + off[1];
    const int64_t begin = split * lines.chunk;
    const int64_t end = std::min(lines.n, begin + lines.chunk);
    for (int64_t i = begin + threadIdx.y; i < end; i += blockDim.y)
      s = fn.combine(s, fn.make(src[i * lines.stride], i));
  }
  if (blockDim.y > 1) {
    values[threadIdx.y * kColumnLines + threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.y / 2; half > 0; half /= 2) {
      if (threadIdx.y < half) {
        State& a = values[threadIdx.y * kColumnLines + threadIdx.x];
        a = fn.combine(a, values[(threadIdx.y + half) * kColumnLines + threadIdx.x]);
      }
      __syncthreads();
    }
    s = values[threadIdx.x];
  }
  if (threadIdx.y == 0 && line < lines.count) {
    if (lines.splits == 1)
      fn.write(out + off[0], s, lines.n);
    else
      partial[line * lines.splits + split] = s;
  }
}

// Folds each line's split states in order and writes the output.
template <typename Fn>
__global__ void reduce_finish_kernel(const typename Fn::State* __restrict__ partial, typename Fn::Out* __restrict__ out,
                                     Lines lines, Fn fn) {
  MICROLLM_GRID_STRIDE_LOOP(line, lines.count) {
    int64_t off[2];
    lines.meta.offsets(line, off);
    typename Fn::State s = fn.identity();
    for (int sp = 0; sp < lines.splits; ++sp) s = fn.combine(s, partial[line * lines.splits + sp]);
    fn.write(out + off[0], s, lines.n);
  }
}

// Reduces `dim` of x into out (x's shape with that dim of size 1) with the combine rules of fn.
template <typename T, typename Fn>
void reduce_lines(const Tensor& x, int dim, const Tensor& out, Fn fn) {
  using State = typename Fn::State;
  using Out = typename Fn::Out;
  Lines lines{};
  lines.count = out.numel();
  if (lines.count == 0) return;
  Launch launch(out);
  Strides x_strides = x.strides();
  x_strides[dim] = 0;  // out's dim has size 1: this stride is never used
  lines.meta = make_strided_meta<2>(out.shape(), {out.strides(), x_strides});
  lines.n = x.size(dim);
  lines.stride = x.stride(dim);
  lines.chunk = std::max<int64_t>(lines.n, 1);
  lines.splits = 1;
  const T* src = static_cast<const T*>(x.data_ptr());
  Out* dst = static_cast<Out*>(out.data_ptr());
  const bool row_kernel = lines.stride == 1 && lines.n > kShortLine;
  // Splits: only when there are too few lines (or line groups) to fill the GPU and the lines are long.
  const int64_t groups = row_kernel ? lines.count : ceil_div(lines.count, kColumnLines);
  const int64_t min_chunk = row_kernel ? 8192 : 1024;
  if (groups < kFillBlocks && lines.n >= 2 * min_chunk) {
    const int64_t want = std::min(ceil_div(kFillBlocks, groups), ceil_div(lines.n, min_chunk));
    lines.chunk = ceil_div(ceil_div(lines.n, std::min<int64_t>(want, 65535)), 64) * 64;  // keeps packs aligned
    lines.splits = static_cast<int>(ceil_div(lines.n, lines.chunk));
  }
  Tensor scratch;
  State* partial = nullptr;
  if (lines.splits > 1) {
    scratch =
        Tensor::empty({lines.count * lines.splits * static_cast<int64_t>(sizeof(State))}, DType::u8, out.device());
    partial = static_cast<State*>(scratch.data_ptr());
  }
  if (row_kernel) {
    const int threads = static_cast<int>(
        std::clamp<int64_t>(rows::next_pow2(ceil_div(std::min(lines.n, lines.chunk), 8)), 32, kRowThreads));
    const int64_t blocks = std::min<int64_t>(lines.count * lines.splits, kMaxBlocks);
    reduce_rows_kernel<T, Fn>
        <<<static_cast<unsigned>(blocks), threads, 0, launch.stream>>>(src, dst, partial, lines, fn);
  } else {
    const int y = lines.n <= kShortLine ? 1 : kColumnSplit;
    const dim3 grid(static_cast<unsigned>(ceil_div(lines.count, kColumnLines)), static_cast<unsigned>(lines.splits));
    reduce_columns_kernel<T, Fn><<<grid, dim3(kColumnLines, y), 0, launch.stream>>>(src, dst, partial, lines, fn);
  }
  MICROLLM_CUDA_CHECK_LAUNCH();
  if (lines.splits > 1) {
    reduce_finish_kernel<Fn><<<grid_for(lines.count), kThreads, 0, launch.stream>>>(partial, dst, lines, fn);
    MICROLLM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int dim, const Tensor& out) {
  OpScope scope(reduce_op_name(op), device_, detail::current_cuda_stream(device_));
  visit_numeric(x.dtype(), reduce_op_name(op), [&]<typename T>() {
    switch (op) {
      case ReduceOp::sum: reduce_lines<T>(x, dim, out, ReduceFn<T, ReduceOp::sum>{}); break;
      case ReduceOp::mean: reduce_lines<T>(x, dim, out, ReduceFn<T, ReduceOp::mean>{}); break;
      case ReduceOp::max: reduce_lines<T>(x, dim, out, ReduceFn<T, ReduceOp::max>{}); break;
      case ReduceOp::min: reduce_lines<T>(x, dim, out, ReduceFn<T, ReduceOp::min>{}); break;
    }
  });
}

void CudaBackend::argmax(const Tensor& x, int dim, const Tensor& out) {
  OpScope scope("argmax", device_, detail::current_cuda_stream(device_));
  visit_numeric(x.dtype(), "argmax", [&]<typename T>() { reduce_lines<T>(x, dim, out, ArgmaxFn<T>{}); });
}

}  // namespace microllm
