// CUDA rotary position embedding: x [B, T, H, D] (any strides) -> out [B, T, H, D] contiguous.
// One thread per (token, pair i): it computes the angle position * inv_freq[i] and its sine and cosine
// once, then turns pair i of every head of its token. Consecutive threads take consecutive pairs, so the
// loads and stores of a warp are coalesced for both layouts. The inverse frequencies come from
// rope_math.h on the host (the CPU's numbers exactly) and travel by value as a kernel argument.
#include <cmath>

#include "common.cuh"
#include "rope.cuh"
#include "cuda_backend.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

constexpr int kMaxRopeHalf = 256;  // head dims up to 512

template <typename A>
using InvFreq = rotary::InvFreq<A, kMaxRopeHalf>;

template <typename T, typename P>
struct RopeArgs {
  const T* x;
  const P* positions;  // [B, T], strides ps (ps[0] is 0 for shared positions)
  T* out;              // [B, T, H, D] contiguous
  int64_t seq, heads, dim, half;
  int64_t xs[4], ps[2];
  int64_t pair_step, partner;  // pair i is (i * pair_step, i * pair_step + partner)
  bool inverse;                // turn by -angle
};

template <typename T, typename P>
__global__ void rope_kernel(const RopeArgs<T, P> args, const InvFreq<acc_t<T>> freq, int64_t items) {
  using A = acc_t<T>;
  MICROLLM_GRID_STRIDE_LOOP(item, items) {  // item = token * half + i
    const int64_t token = item / args.half, i = item % args.half;
    const int64_t b = token / args.seq, t = token % args.seq;
    const auto pos = static_cast<A>(static_cast<int64_t>(args.positions[b * args.ps[0] + t * args.ps[1]]));
    A sn, cs;
    rotary::angle_sin_cos(pos, freq.v[i], &sn, &cs);
    if (args.inverse) sn = -sn;
    const int64_t first = i * args.pair_step, second = first + args.partner;
    const T* x_first = args.x + b * args.xs[0] + t * args.xs[1] + first * args.xs[3];
    const T* x_second = args.x + b * args.xs[0] + t * args.xs[1] + second * args.xs[3];
    T* out_token = args.out + token * args.heads * args.dim;
#pragma unroll 4
    for (int64_t h = 0; h < args.heads; ++h) {
      A y1, y2;
      rotary::turn(to_acc(x_first[h * args.xs[2]]), to_acc(x_second[h * args.xs[2]]), cs, sn, y1, y2);
      out_token[h * args.dim + first] = from_acc<T>(y1);
      out_token[h * args.dim + second] = from_acc<T>(y2);
    }
  }
}

template <typename T, typename P>
void launch_rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse, const Tensor& out,
                 const InvFreq<acc_t<T>>& freq, cudaStream_t stream) {
  RopeArgs<T, P> args{};
  args.x = static_cast<const T*>(x.data_ptr());
  args.positions = static_cast<const P*>(positions.data_ptr());
  args.out = static_cast<T*>(out.data_ptr());
  args.seq = x.size(1);
  args.heads = x.size(2);
  args.dim = x.size(3);
  args.half = args.dim / 2;
  for (int d = 0; d < 4; ++d) args.xs[d] = x.stride(d);
  args.ps[0] = positions.stride(0);
  args.ps[1] = positions.stride(1);
  const bool split = params.layout == RopeLayout::split_half;
  args.pair_step = split ? 1 : 2;
  args.partner = split ? args.half : 1;
  args.inverse = inverse;
  const int64_t items = x.size(0) * args.seq * args.half;
  rope_kernel<T, P><<<grid_for(items), kThreads, 0, stream>>>(args, freq, items);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

// angle = position * inv_freq[i] in f32 (f64 for f64); a' = a cos - b sin, b' = b cos + a sin.
void CudaBackend::rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
                       const Tensor& out) {
  const char* op = inverse ? "rope_backward" : "rope";
  OpScope scope(op, device_, detail::current_cuda_stream(device_));
  visit_float(x.dtype(), op, [&]<typename T>() {
    using A = acc_t<T>;
    const int64_t dim = x.size(3), half = dim / 2;
    MICROLLM_CHECK(half <= kMaxRopeHalf, NotSupportedError, op, "head dim ", dim,
                   " exceeds the CUDA kernel's limit of ", 2 * kMaxRopeHalf);
    if (out.numel() == 0) return;
    Launch launch(out);
    const InvFreq<A> freq = rotary::inv_freq_arg<A, kMaxRopeHalf>(params, dim);
    switch (positions.dtype()) {
      case DType::i32: return launch_rope<T, int32_t>(x, positions, params, inverse, out, freq, launch.stream);
      case DType::i64: return launch_rope<T, int64_t>(x, positions, params, inverse, out, freq, launch.stream);
      default: throw DTypeError(op, str_cat("positions must be i32 or i64, got ", positions.dtype()));
    }
  });
}

}  // namespace microllm
