// Alignment of a model's named points (nn/taps.h) against a reference (transformers' values at the same points,
// tools/oracle/align_reference.py): per point the largest absolute difference, the relative error
// ||ours - ref|| / ||ref|| and the cosine similarity, the first point past a tolerance, and the error by depth as
// a table and an SVG. `microllm align` prints it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "microllm/core/tensor.h"

namespace microllm::profile {

struct PointComparison {
  std::string name;
  Shape ours, reference;
  bool present = true;  // false: the reference has the point, the model did not produce it
  double max_abs_diff = 0, relative_error = 0, cosine = 1;
  bool past_tolerance = false;  // relative error above the tolerance, a shape mismatch, or absent
};

// Compares any dtype and device (both read as f32 on the host). Shapes must be equal; else the comparison says so
// (past_tolerance, NaN statistics).
PointComparison compare_point(const std::string& name, const Tensor& ours, const Tensor& reference,
                              double tolerance);
PointComparison missing_point(const std::string& name, const Tensor& reference);

struct Alignment {
  double tolerance = 0;
  std::vector<PointComparison> values;     // forward order
  std::vector<PointComparison> gradients;  // backward order: from the loss toward the embedding
  // The first value point past the tolerance in forward order; the first gradient point in backward order.
  std::optional<size_t> first_divergent_value() const;
  std::optional<size_t> first_divergent_gradient() const;
};

// A fixed-width table per kind, the first divergent point marked, and a verdict line.
std::string to_text(const Alignment& alignment);
// Error by depth: log10 relative error of each value point (and of the gradients at the same points) along the
// forward, the tolerance as a dashed line, the first divergence marked, layer boundaries on the axis.
std::string to_svg(const Alignment& alignment, const std::string& title);

}  // namespace microllm::profile
