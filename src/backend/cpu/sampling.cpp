// The CPU sampling kernel: each row through sampling::sample_row, the reference that the host Sampler uses
// too (with the row's bias when its params say so), then the row's state updated (offset + 1, counts + 1 at
// the chosen id). Rows run in parallel.
// greedy_only changes nothing in the math (a greedy row is the first candidate either way); it is checked, so
// that a caller's wrong promise fails here as it would on CUDA instead of passing on the CPU only.
#include <vector>

#include "cpu_backend.h"
#include "dispatch.h"
#include "microllm/backend/sampling_math.h"

namespace microllm {

void CpuBackend::sample_tokens(const Tensor& logits, const Tensor& params, const Tensor& rng, const Tensor& counts,
                               const Tensor& bias, bool greedy_only, const Tensor& out) {
  if (greedy_only) {  // every row checked before any state changes: a failed call leaves the rows as they were
    const auto* param = static_cast<const float*>(params.data_ptr());
    for (int64_t b = 0; b < logits.size(0); ++b) {
      const sampling::RowParams p = sampling::row_params(param + b * params.stride(0), params.stride(1));
      MICROLLM_CHECK(p.greedy(), ValueError, "sample_tokens", "SamplerRows::greedy_only promised greedy rows, but row ",
                     b, " has temperature ", p.temperature);
    }
  }
  cpu::visit_float(logits.dtype(), "sample_tokens", [&]<typename T>() {
    const T* src = static_cast<const T*>(logits.data_ptr());
    const auto* param = static_cast<const float*>(params.data_ptr());
    auto* state = static_cast<int64_t*>(rng.data_ptr());
    int32_t* count = counts.defined() ? static_cast<int32_t*>(counts.data_ptr()) : nullptr;
    const float* biases = bias.defined() ? static_cast<const float*>(bias.data_ptr()) : nullptr;
    auto* ids = static_cast<int32_t*>(out.data_ptr());
    const int64_t vocab = logits.size(1);
    detail::parallel_for(0, logits.size(0), 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> x(static_cast<size_t>(vocab));
      std::vector<uint64_t> keys;
      for (int64_t b = lo; b < hi; ++b) {
        const T* row = src + b * logits.stride(0);
        for (int64_t v = 0; v < vocab; ++v)
          x[static_cast<size_t>(v)] = static_cast<float>(cpu::load(row + v * logits.stride(1)));
        const sampling::RowParams p = sampling::row_params(param + b * params.stride(0), params.stride(1));
        int64_t* seed = state + b * rng.stride(0);
        int64_t* offset = seed + rng.stride(1);
        const float u = sampling::draw_uniform(static_cast<uint64_t>(*seed), static_cast<uint64_t>(*offset));
        int32_t* row_counts = count != nullptr ? count + b * counts.stride(0) : nullptr;
        sampling::RowState row_state;
        if (biases != nullptr && p.biased()) row_state = {biases + b * bias.stride(0), bias.stride(1)};
        if (row_counts != nullptr && p.penalized()) {
          row_state.counts = row_counts;
          row_state.counts_stride = counts.stride(1);
        }
        const int32_t id = sampling::sample_row(x, row_state, p, u, keys);
        ids[b * out.stride(0)] = id;
        *offset += 1;
        if (row_counts != nullptr) row_counts[id * counts.stride(1)] += 1;
      }
    });
  });
}

}  // namespace microllm
