// qk_rms_norm: checks and dispatch (ops/qk_norm.h).
#include "microllm/ops/qk_norm.h"

#include <cmath>

#include "checks.h"
#include "microllm/backend/fusions.h"

namespace microllm {

std::pair<Tensor, Tensor> qk_rms_norm(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                                      double eps) {
  const char* op = "qk_rms_norm";
  checks::floating(op, q, "q");
  MICROLLM_CHECK(q.dim() >= 1, ShapeError, op, "q must have rank >= 1, got shape ", q.shape());
  const int64_t d = q.size(-1);
  MICROLLM_CHECK(k.dim() >= 1 && k.size(-1) == d, ShapeError, op, "k shape ", k.shape(),
                 " does not end in the head dim of q ", q.shape());
  checks::same_dtype(op, q, "q", k, "k");
  checks::same_device(op, q, "q", k, "k");
  checks::qk_norm_weights(op, q, q_weight, k_weight, eps);
  return fusions_for(q.device()).normalized_qk(q, k, {q_weight, k_weight, eps});
}

void checks::qk_norm_weights(const char* op, const Tensor& q, const Tensor& q_weight, const Tensor& k_weight,
                             double eps) {
  const int64_t d = q.size(-1);
  for (const auto& [w, name] : {std::pair{&q_weight, "q weight"}, {&k_weight, "k weight"}}) {
    checks::defined(op, *w, name);
    checks::same_dtype(op, q, "q", *w, name);
    checks::same_device(op, q, "q", *w, name);
    MICROLLM_CHECK(w->dim() == 1 && w->size(0) == d, ShapeError, op, name, " shape ", w->shape(),
                   " does not match the head dim ", d);
  }
  MICROLLM_CHECK(std::isfinite(eps) && eps > 0, ValueError, op, "eps must be a finite number > 0, got ", eps);
}

}  // namespace microllm
