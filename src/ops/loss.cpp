// Cross-entropy: checks (targets included), flattening of [..., V] logits, dispatch, and the backward.
#include "microllm/ops/loss.h"

#include <utility>
#include <vector>

#include "checks.h"

namespace microllm {
namespace {

// f64 logits give an f64 loss (so f64 finite differences check the gradient exactly); others f32.
DType loss_dtype(const Tensor& logits) { return logits.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// Checks logits [..., V] and targets [...]; returns them as [N, V] and [N].
std::pair<Tensor, Tensor> check_and_flatten(const char* op, const Tensor& logits, const Tensor& targets,
                                            int64_t ignore_index) {
  checks::floating(op, logits, "logits");
  checks::index_dtype(op, targets, "targets");
  checks::same_device(op, logits, "logits", targets, "targets");
  MICROLLM_CHECK(logits.dim() >= 1, ShapeError, op, "logits must have rank >= 1 ([..., V]), got shape ",
                 logits.shape());
  const int64_t vocab = logits.size(-1);
  MICROLLM_CHECK(vocab > 0, ShapeError, op, "logits shape ", logits.shape(), " has no classes");
  bool shapes_match = targets.dim() == logits.dim() - 1;
  for (int d = 0; shapes_match && d < targets.dim(); ++d) shapes_match = targets.size(d) == logits.size(d);
  MICROLLM_CHECK(shapes_match, ShapeError, op, "targets shape ", targets.shape(), " does not match logits shape ",
                 logits.shape(), " without its last dim");
  // Host-side check of CPU targets (device kernels check their own): position in the flattened targets.
  if (targets.device().is_cpu()) {
    const std::vector<int64_t> values = targets.to_vector<int64_t>();
    for (size_t n = 0; n < values.size(); ++n) {
      MICROLLM_CHECK(values[n] == ignore_index || (values[n] >= 0 && values[n] < vocab), IndexError, op, "target ",
                     values[n], " at position ", n, " is out of range [0, ", vocab, ") and is not ignore_index (",
                     ignore_index, ")");
    }
  }
  return {logits.reshape({-1, vocab}), targets.reshape({-1})};
}

}  // namespace

// mean over kept n of logsumexp(logits[n]) - logits[n, t_n]; 0 when every target is ignored (torch: NaN).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const auto [x, t] = check_and_flatten("cross_entropy", logits, targets, ignore_index);
  Tensor loss = Tensor::empty({}, loss_dtype(logits), logits.device());
  backend_for(logits.device()).cross_entropy(x, t, ignore_index, loss);
  return loss;
}

// grad_logits[n] = grad_loss * (softmax(logits[n]) - onehot(t_n)) / count for kept rows, 0 for ignored.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                              int64_t ignore_index) {
  const char* op = "cross_entropy_backward";
  const auto [x, t] = check_and_flatten(op, logits, targets, ignore_index);
  checks::floating(op, grad_loss, "grad_loss");
  checks::same_device(op, logits, "logits", grad_loss, "grad_loss");
  MICROLLM_CHECK(grad_loss.dim() == 0, ShapeError, op, "grad_loss must have rank 0 (like the loss), got shape ",
                 grad_loss.shape());
  Tensor grad_logits = Tensor::empty(x.shape(), logits.dtype(), logits.device());  // [N, V]
  backend_for(logits.device())
      .cross_entropy_backward(x, t, ignore_index, grad_loss.to(loss_dtype(logits)), grad_logits);
  return grad_logits.view(logits.shape());
}

}  // namespace microllm
