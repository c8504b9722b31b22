// sample_tokens: checks and dispatch. The math is microllm/backend/sampling_math.h.
#include "microllm/ops/sampling.h"

#include <cmath>

#include "checks.h"
#include "microllm/backend/sampling_math.h"

namespace microllm {
namespace {

constexpr const char* kOp = "sample_tokens";

// A state tensor the op writes must not alias itself: a broadcast (stride 0) dim of size > 1 would make
// two rows update one element.
void no_broadcast(const Tensor& t, const char* name) {
  for (int d = 0; d < t.dim(); ++d) {
    MICROLLM_CHECK(t.size(d) <= 1 || t.stride(d) != 0, ValueError, kOp, name, " of shape ", t.shape(),
                   " is broadcast along dim ", d, "; the op writes it, so every row needs its own elements");
  }
}

void check_state(const Tensor& t, const char* name, DType dtype, const Shape& shape, const Tensor& logits) {
  checks::defined(kOp, t, name);
  MICROLLM_CHECK(t.dtype() == dtype, DTypeError, kOp, name, " must be ", dtype, ", got ", t.dtype());
  MICROLLM_CHECK(t.shape() == shape, ShapeError, kOp, name, " must have shape ", shape, " for logits of shape ",
                 logits.shape(), ", got ", t.shape());
  checks::same_device(kOp, logits, "logits", t, name);
}

}  // namespace

void sample_tokens(const Tensor& logits, const SamplerRows& rows, const Tensor& out) {
  checks::defined(kOp, logits, "logits");
  checks::rank(kOp, logits, "logits", 2);
  const DType dtype = logits.dtype();
  // An f64 model's logits are rounded to f32 first, on every device: the sampling math is f32, and the kernels
  // read f32, bf16 and f16.
  if (dtype == DType::f64) return sample_tokens(logits.to(DType::f32), rows, out);
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError, kOp,
                 "logits must be f32, bf16, f16 or f64, got ", dtype);
  const int64_t batch = logits.size(0), vocab = logits.size(1);
  MICROLLM_CHECK(vocab > 0, ShapeError, kOp, "logits of shape ", logits.shape(), " have no vocabulary");
  // Ids are i32 and the kernels' keys hold an id in 32 bits.
  MICROLLM_CHECK(vocab <= INT32_MAX, ShapeError, kOp, "a vocabulary of ", vocab, " does not fit i32 ids");
  check_state(rows.params, "params", DType::f32, {batch, sampling::kParamCount}, logits);
  check_state(rows.rng, "rng", DType::i64, {batch, 2}, logits);
  no_broadcast(rows.rng, "rng");
  if (rows.counts.defined()) {
    check_state(rows.counts, "counts", DType::i32, {batch, vocab}, logits);
    no_broadcast(rows.counts, "counts");
  }
  if (rows.bias.defined()) check_state(rows.bias, "bias", DType::f32, {batch, vocab}, logits);
  check_state(out, "out", DType::i32, {batch}, logits);
  no_broadcast(out, "out");
  if (batch == 0) return;
  backend_for(logits.device())
      .sample_tokens(logits, rows.params, rows.rng, rows.counts, rows.bias, rows.greedy_only, out);
}

Tensor sample_tokens(const Tensor& logits, const SamplerRows& rows) {
  checks::defined(kOp, logits, "logits");
  checks::rank(kOp, logits, "logits", 2);
  Tensor out = Tensor::empty({logits.size(0)}, DType::i32, logits.device());
  sample_tokens(logits, rows, out);
  return out;
}

SamplerRows make_sampler_rows(const std::vector<float>& params, const std::vector<int64_t>& seeds, int64_t vocab,
                              const std::vector<std::vector<int32_t>>& histories, Device device,
                              const std::vector<LogitBias>& biases) {
  constexpr const char* op = "make_sampler_rows";
  const auto batch = static_cast<int64_t>(seeds.size());
  MICROLLM_CHECK(static_cast<int64_t>(params.size()) == batch * sampling::kParamCount, ShapeError, op, "params has ",
                 params.size(), " values; ", batch, " rows need ", batch * sampling::kParamCount);
  MICROLLM_CHECK(histories.empty() || static_cast<int64_t>(histories.size()) == batch, ShapeError, op, histories.size(),
                 " histories for ", batch, " rows");
  MICROLLM_CHECK(biases.empty() || static_cast<int64_t>(biases.size()) == batch, ShapeError, op, biases.size(),
                 " logit bias lists for ", batch, " rows");
  MICROLLM_CHECK(vocab > 0 && vocab <= INT32_MAX, ShapeError, op, "bad vocabulary size ", vocab);
  std::vector<int64_t> rng;
  rng.reserve(seeds.size() * 2);
  for (int64_t seed : seeds) {
    rng.push_back(seed);
    rng.push_back(0);
  }
  std::vector<float> row_params = params;
  std::vector<float> bias;
  const LogitBias none;
  for (int64_t b = 0; b < batch; ++b) {  // the kLogitBias column follows the lists, whatever params held there
    const LogitBias& entries = biases.empty() ? none : biases[static_cast<size_t>(b)];
    row_params[static_cast<size_t>(b * sampling::kParamCount + sampling::kLogitBias)] = entries.empty() ? 0.0f : 1.0f;
    if (entries.empty()) continue;
    if (bias.empty()) bias.assign(static_cast<size_t>(batch * vocab), 0.0f);
    for (const auto& [id, value] : entries) {
      MICROLLM_CHECK(id >= 0 && id < vocab, IndexError, op, "logit bias token ", id, " of row ", b,
                     " is outside the vocabulary of ", vocab);
      MICROLLM_CHECK(std::isfinite(value), ValueError, op, "logit bias of token ", id, " of row ", b,
                     " is not finite: ", value);
      bias[static_cast<size_t>(b * vocab + id)] = value;
    }
  }
  SamplerRows rows;
  rows.params = Tensor::from_vector(row_params, {batch, sampling::kParamCount}, device);
  if (!bias.empty()) rows.bias = Tensor::from_vector(bias, {batch, vocab}, device);
  rows.greedy_only = true;
  for (int64_t b = 0; b < batch; ++b)
    rows.greedy_only = rows.greedy_only && sampling::row_params(row_params.data() + b * sampling::kParamCount, 1).greedy();
  rows.rng = Tensor::from_vector(rng, {batch, 2}, device);
  if (!histories.empty()) {
    std::vector<int32_t> counts(static_cast<size_t>(batch * vocab), 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int32_t id : histories[static_cast<size_t>(b)]) {
        MICROLLM_CHECK(id >= 0 && id < vocab, IndexError, op, "id ", id, " of history ", b,
                       " is outside the vocabulary of ", vocab);
        ++counts[static_cast<size_t>(b * vocab + id)];
      }
    }
    rows.counts = Tensor::from_vector(counts, {batch, vocab}, device);
  }
  return rows;
}

}  // namespace microllm
