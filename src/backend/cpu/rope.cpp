// CPU rotary position embedding.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"
#include "microllm/backend/rope_math.h"

namespace microllm {

// x [B, T, H, D] any strides, positions [B, T] (maybe expanded), out [B, T, H, D] contiguous.
// angle = position * inv_freq[i] in f32 (f64 for f64, so the f64 gradient check is exact). Each pair (a, b)
// turns by the angle: a' = a cos - b sin, b' = b cos + a sin; inverse turns by -angle (the transpose).
void CpuBackend::rope(const Tensor& x, const Tensor& positions, const RopeParams& params, bool inverse,
                      const Tensor& out) {
  cpu::visit_float(x.dtype(), "rope", [&]<typename T>() {
    using A = cpu::acc_t<T>;
    const int64_t seq = x.size(1), heads = x.size(2), dim = x.size(3), half = dim / 2;
    const std::vector<A> inv_freq = rope_inv_freq_as<A>(params, dim);
    // Pair i is (i, i + D/2) in split_half and (2i, 2i + 1) in interleaved.
    const bool split = params.layout == RopeLayout::split_half;
    const int64_t pair_step = split ? 1 : 2, partner = split ? half : 1;
    const T* xs = static_cast<const T*>(x.data_ptr());
    T* ys = static_cast<T*>(out.data_ptr());
    const Strides xst = x.strides();
    const int64_t token_grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(heads * dim, 1));

    detail::parallel_for(0, x.size(0) * seq, token_grain, [&](int64_t lo, int64_t hi) {
      std::vector<A> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));  // of one token
      for (int64_t token = lo; token < hi; ++token) {
        const int64_t b = token / seq, t = token % seq;
        const auto pos = static_cast<A>(cpu::load_index(positions, b * positions.stride(0) + t * positions.stride(1)));
        for (int64_t i = 0; i < half; ++i) {
          const A angle = pos * inv_freq[static_cast<size_t>(i)];
          cos_t[static_cast<size_t>(i)] = std::cos(angle);
          sin_t[static_cast<size_t>(i)] = inverse ? -std::sin(angle) : std::sin(angle);
        }
        for (int64_t head = 0; head < heads; ++head) {
          const T* x_head = xs + b * xst[0] + t * xst[1] + head * xst[2];
          T* y_head = ys + (token * heads + head) * dim;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t first = i * pair_step, second = first + partner;
            const A a = cpu::load(x_head + first * xst[3]);
            const A c = cpu::load(x_head + second * xst[3]);
            const A cs = cos_t[static_cast<size_t>(i)], sn = sin_t[static_cast<size_t>(i)];
            cpu::store(y_head + first, a * cs - c * sn);
            cpu::store(y_head + second, c * cs + a * sn);
          }
        }
      }
    });
  });
}

}  // namespace microllm
