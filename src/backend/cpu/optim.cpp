// CPU optimizer kernels: multi-tensor AdamW and SGD steps (the formulas of optim_math.h), and the sum of
// squares of a list of tensors. Plain loops over each tensor, threaded over elements; the sums use a
// fixed partition into chunks, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../optim_math.h"
#include "cpu_backend.h"
#include "dispatch.h"

namespace microllm {
namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per partial sum

float grad_scale_value(const Tensor& grad_scale) {
  return grad_scale.defined() ? *static_cast<const float*>(grad_scale.data_ptr()) : 1.0f;
}

// fn.template operator()<M>() for the moment storage type (f32 or bf16).
template <typename Fn>
void visit_moment(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::bf16: return fn.template operator()<bf16>();
    default: cpu::no_kernel(op, dtype);
  }
}

}  // namespace

void CpuBackend::adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                            const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                            const std::vector<double>& weight_decay, const Tensor& grad_scale, const AdamWStep& step) {
  if (params.empty()) return;
  const float scale = grad_scale_value(grad_scale);
  const optim_math::AdamWScalars s = optim_math::adamw_scalars(step);
  visit_moment(exp_avg[0].dtype(), "adamw_step", [&]<typename M>() {
    for (size_t t = 0; t < params.size(); ++t) {
      float* p = static_cast<float*>(params[t].data_ptr());
      const float* g = static_cast<const float*>(grads[t].data_ptr());
      M* m = static_cast<M*>(exp_avg[t].data_ptr());
      M* v = static_cast<M*>(exp_avg_sq[t].data_ptr());
      const float decay = static_cast<float>(1.0 - step.lr * weight_decay[t]);
      detail::parallel_for(0, params[t].numel(), detail::kParallelGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const uint32_t bits = optim_math::rounding_bits(s.seed, t, static_cast<uint64_t>(i));
          optim_math::adamw_element(p[i], g[i] * scale, m + i, v + i, decay, s, bits);
        }
      });
    }
  });
}

void CpuBackend::sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& momentum_buffer, const std::vector<double>& weight_decay,
                          const Tensor& grad_scale, const SgdStep& step) {
  if (params.empty()) return;
  const float scale = grad_scale_value(grad_scale);
  const optim_math::SgdScalars s = optim_math::sgd_scalars(step);
  const DType moment_dtype = momentum_buffer.empty() ? DType::f32 : momentum_buffer[0].dtype();
  visit_moment(moment_dtype, "sgd_step", [&]<typename M>() {
    for (size_t t = 0; t < params.size(); ++t) {
      float* p = static_cast<float*>(params[t].data_ptr());
      const float* g = static_cast<const float*>(grads[t].data_ptr());
      M* buf = momentum_buffer.empty() ? nullptr : static_cast<M*>(momentum_buffer[t].data_ptr());
      const float wd = static_cast<float>(weight_decay[t]);
      detail::parallel_for(0, params[t].numel(), detail::kParallelGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const uint32_t bits = optim_math::rounding_bits(s.seed, t, static_cast<uint64_t>(i));
          optim_math::sgd_element(p[i], g[i] * scale, buf ? buf + i : nullptr, wd, s, bits);
        }
      });
    }
  });
}

void CpuBackend::sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) {
  // Every tensor cut into chunks of kChunk elements; chunk sums in f64, then each tensor's chunks in order.
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  std::vector<size_t> first_chunk(tensors.size() + 1, 0);
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (int64_t begin = 0; begin < tensors[t].numel(); begin += kChunk) {
      chunks.push_back({t, begin, std::min(tensors[t].numel(), begin + kChunk)});
    }
    first_chunk[t + 1] = chunks.size();
  }
  std::vector<double> partial(chunks.size(), 0.0);
  detail::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const Chunk& chunk = chunks[static_cast<size_t>(c)];
      const Tensor& x = tensors[chunk.tensor];
      cpu::visit_float(x.dtype(), "sum_squares", [&]<typename T>() {
        const T* data = static_cast<const T*>(x.data_ptr());
        double sum = 0;
        for (int64_t i = chunk.begin; i < chunk.end; ++i) {
          const double value = static_cast<double>(cpu::load(data + i));
          sum += value * value;
        }
        partial[static_cast<size_t>(c)] = sum;
      });
    }
  });
  float* result = static_cast<float*>(out.data_ptr());
  for (size_t t = 0; t < tensors.size(); ++t) {
    double sum = 0;
    for (size_t c = first_chunk[t]; c < first_chunk[t + 1]; ++c) sum += partial[c];
    result[t] = static_cast<float>(sum);
  }
}

}  // namespace microllm
