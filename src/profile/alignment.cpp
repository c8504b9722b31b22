#include "microllm/profile/alignment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "svg.h"

namespace microllm::profile {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string shape_text(const Shape& shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

std::string scientific(double v, int digits = 2) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*e", digits, v);
  return buffer;
}

std::optional<size_t> first_past(const std::vector<PointComparison>& points) {
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].past_tolerance) return i;
  }
  return std::nullopt;
}

void table(std::ostringstream& out, const std::vector<PointComparison>& points, std::optional<size_t> first) {
  size_t name_width = 5;
  for (const PointComparison& p : points) name_width = std::max(name_width, p.name.size());
  char line[512];
  std::snprintf(line, sizeof line, "  %-*s  %-18s  %10s  %10s  %9s\n", static_cast<int>(name_width), "point", "shape",
                "max|diff|", "rel.err", "cosine");
  out << line;
  for (size_t i = 0; i < points.size(); ++i) {
    const PointComparison& p = points[i];
    const char* mark = first == i ? ">" : (p.past_tolerance ? "!" : " ");
    if (!p.present) {
      std::snprintf(line, sizeof line, "%s %-*s  %-18s  not produced by this model\n", mark,
                    static_cast<int>(name_width), p.name.c_str(), shape_text(p.reference).c_str());
    } else if (p.ours != p.reference) {
      std::snprintf(line, sizeof line, "%s %-*s  %-18s  shape differs: the reference has %s\n", mark,
                    static_cast<int>(name_width), p.name.c_str(), shape_text(p.ours).c_str(),
                    shape_text(p.reference).c_str());
    } else {
      std::snprintf(line, sizeof line, "%s %-*s  %-18s  %10s  %10s  %9.6f%s\n", mark, static_cast<int>(name_width),
                    p.name.c_str(), shape_text(p.ours).c_str(), scientific(p.max_abs_diff).c_str(),
                    scientific(p.relative_error).c_str(), p.cosine, first == i ? "   <- first past the tolerance" : "");
    }
    out << line;
  }
}

void verdict(std::ostringstream& out, const char* kind, const std::vector<PointComparison>& points,
             std::optional<size_t> first, double tolerance) {
  if (points.empty()) return;
  if (first) {
    const PointComparison& p = points[*first];
    out << kind << ": first divergence at " << p.name;
    if (!p.present) {
      out << " (not produced by this model)\n";
    } else if (p.ours != p.reference) {
      out << " (shape " << p.ours << ", reference " << p.reference << ")\n";
    } else {
      out << " (relative error " << scientific(p.relative_error) << " > " << scientific(tolerance, 0) << ")\n";
    }
    return;
  }
  const auto worst = std::max_element(points.begin(), points.end(), [](const auto& a, const auto& b) {
    return a.relative_error < b.relative_error;
  });
  out << kind << ": all " << points.size() << " points within " << scientific(tolerance, 0)
      << " (largest relative error " << scientific(worst->relative_error) << " at " << worst->name << ")\n";
}

}  // namespace

PointComparison compare_point(const std::string& name, const Tensor& ours, const Tensor& reference,
                              double tolerance) {
  PointComparison p;
  p.name = name;
  p.ours = ours.shape();
  p.reference = reference.shape();
  if (p.ours != p.reference) {
    p.max_abs_diff = p.relative_error = p.cosine = kNaN;
    p.past_tolerance = true;
    return p;
  }
  const std::vector<float> a = ours.to_vector<float>(), b = reference.to_vector<float>();
  double diff2 = 0, a2 = 0, b2 = 0, dot = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i], d = x - y;
    diff2 += d * d, a2 += x * x, b2 += y * y, dot += x * y;
    max_abs = std::isnan(d) ? kNaN : std::max(max_abs, std::abs(d));
  }
  p.max_abs_diff = max_abs;
  p.relative_error = b2 > 0 ? std::sqrt(diff2 / b2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  p.cosine = (a2 > 0 && b2 > 0) ? dot / std::sqrt(a2 * b2) : (a2 == b2 ? 1.0 : 0.0);
  p.past_tolerance = !(p.relative_error <= tolerance);  // NaN is past
  return p;
}

PointComparison missing_point(const std::string& name, const Tensor& reference) {
  PointComparison p;
  p.name = name;
  p.reference = reference.shape();
  p.present = false;
  p.max_abs_diff = p.relative_error = p.cosine = kNaN;
  p.past_tolerance = true;
  return p;
}

std::optional<size_t> Alignment::first_divergent_value() const { return first_past(values); }
std::optional<size_t> Alignment::first_divergent_gradient() const { return first_past(gradients); }

std::string to_text(const Alignment& alignment) {
  std::ostringstream out;
  const std::string bound = scientific(alignment.tolerance, 0);
  if (!alignment.values.empty()) {
    out << "values, forward order (past the tolerance: relative error > " << bound << "; > first, ! later)\n";
    table(out, alignment.values, alignment.first_divergent_value());
  }
  if (!alignment.gradients.empty()) {
    out << "\ngradients of the loss, backward order (from the logits toward the embedding)\n";
    table(out, alignment.gradients, alignment.first_divergent_gradient());
  }
  out << "\n";
  verdict(out, "values", alignment.values, alignment.first_divergent_value(), alignment.tolerance);
  verdict(out, "gradients", alignment.gradients, alignment.first_divergent_gradient(), alignment.tolerance);
  return out.str();
}

std::string to_svg(const Alignment& alignment, const std::string& title) {
  const double width = 960, height = 440, left = 70, right = 24, top = 48, bottom = 120;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const size_t n = std::max<size_t>(alignment.values.size(), 1);
  std::map<std::string, size_t> depth;  // a point's position along the forward
  for (size_t i = 0; i < alignment.values.size(); ++i) depth[alignment.values[i].name] = i;

  auto decade = [](double rel) { return std::log10(std::max(std::isnan(rel) ? 1e3 : rel, 1e-12)); };
  double low = std::floor(decade(alignment.tolerance)) - 1, high = std::ceil(decade(alignment.tolerance)) + 1;
  for (const auto* points : {&alignment.values, &alignment.gradients}) {
    for (const PointComparison& p : *points) {
      low = std::min(low, std::floor(decade(p.relative_error)));
      high = std::max(high, std::ceil(decade(p.relative_error)));
    }
  }
  auto x_of = [&](size_t i) { return left + (n == 1 ? plot_w / 2 : plot_w * static_cast<double>(i) / (n - 1)); };
  auto y_of = [&](double rel) { return top + plot_h * (high - decade(rel)) / (high - low); };

  svg::Picture picture(width, height);
  picture.text(width / 2, 24, title, 15, "middle");
  for (double d = low; d <= high; d += 1) {  // decades
    picture.line(left, y_of(std::pow(10, d)), left + plot_w, y_of(std::pow(10, d)), "#e6e6e6");
    picture.text(left - 6, y_of(std::pow(10, d)) + 4, "1e" + std::to_string(static_cast<int>(d)), 10, "end");
  }
  picture.text(18, top + plot_h / 2, "relative error", 12, "middle", -90);
  for (size_t i = 0; i < alignment.values.size(); ++i) {  // block boundaries: each block's output point
    const std::string& name = alignment.values[i].name;
    if (name.rfind("model.layers.", 0) == 0 && name.find('.', 13) == std::string::npos) {
      picture.line(x_of(i), top, x_of(i), top + plot_h, "#cccccc", "stroke-dasharray=\"2,3\"");
      picture.text(x_of(i), top + plot_h + 14, "block " + name.substr(13), 10, "end", -45);
    }
  }
  picture.line(left, top + plot_h, left + plot_w, top + plot_h, "#333333");
  picture.line(left, top, left, top + plot_h, "#333333");
  picture.line(left, y_of(alignment.tolerance), left + plot_w, y_of(alignment.tolerance), "#d62728",
               "stroke-dasharray=\"6,4\"");
  picture.text(left + plot_w - 4, y_of(alignment.tolerance) - 4, "tolerance " + scientific(alignment.tolerance, 0),
               10, "end");

  auto series = [&](const std::vector<PointComparison>& points, const std::string& color) {
    std::vector<std::pair<double, double>> line;
    std::vector<std::pair<size_t, const PointComparison*>> placed;
    for (const PointComparison& p : points) {
      const auto at = depth.find(p.name);
      if (at != depth.end()) placed.emplace_back(at->second, &p);
    }
    std::sort(placed.begin(), placed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [i, p] : placed) line.emplace_back(x_of(i), y_of(p->relative_error));
    picture.polyline(line, color, "stroke-width=\"1.5\"");
    for (const auto& [i, p] : placed) {
      picture.circle(x_of(i), y_of(p->relative_error), 2.5, p->past_tolerance ? "#d62728" : color,
                     p->name + ": " + scientific(p->relative_error));
    }
  };
  series(alignment.values, "#1f77b4");
  if (!alignment.gradients.empty()) series(alignment.gradients, "#ff7f0e");

  if (const auto first = alignment.first_divergent_value()) {
    const double x = x_of(*first), y = y_of(alignment.values[*first].relative_error);
    picture.line(x, y, x, top + plot_h, "#d62728");
    picture.text(x + 6, std::max(y - 8, top + 10), "first divergence: " + alignment.values[*first].name, 11);
  }
  const double legend_y = height - 18;
  picture.line(left, legend_y - 4, left + 24, legend_y - 4, "#1f77b4", "stroke-width=\"2\"");
  picture.text(left + 30, legend_y, "values (forward order)", 11);
  if (!alignment.gradients.empty()) {
    picture.line(left + 200, legend_y - 4, left + 224, legend_y - 4, "#ff7f0e", "stroke-width=\"2\"");
    picture.text(left + 230, legend_y, "gradients at the same points", 11);
  }
  picture.text(left + plot_w, legend_y, "points past the tolerance in red", 11, "end");
  return picture.str();
}

}  // namespace microllm::profile
