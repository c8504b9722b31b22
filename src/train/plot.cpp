#include "microllm/train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace microllm::train {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  return buffer;
}

// About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int count) {
  const double span = hi - lo;
  const double raw = span / std::max(count, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

}  // namespace

std::string line_chart_svg(const std::vector<Series>& series, const std::string& title, const std::string& x_label,
                           const std::string& y_label, int width, int height) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x), y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  if (y_hi <= y_lo) y_hi = y_lo + 1;
  const double y_pad = 0.05 * (y_hi - y_lo);
  y_lo -= y_pad, y_hi += y_pad;
  const double left = 64, right = 150, top = 40, bottom = 52;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return top + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
      << "</text>\n";
  for (double t : ticks(x_lo, x_hi, 8)) {
    svg << "<line x1=\"" << px(t) << "\" y1=\"" << top << "\" x2=\"" << px(t) << "\" y2=\"" << top + plot_h
        << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << px(t) << "\" y=\"" << top + plot_h + 16 << "\" text-anchor=\"middle\">" << number(t)
        << "</text>\n";
  }
  for (double t : ticks(y_lo, y_hi, 6)) {
    svg << "<line x1=\"" << left << "\" y1=\"" << py(t) << "\" x2=\"" << left + plot_w << "\" y2=\"" << py(t)
        << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << number(t) << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\"" << plot_h
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 12 << "\" text-anchor=\"middle\">"
      << escape(x_label) << "</text>\n";
  svg << "<text transform=\"translate(16 " << top + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << escape(y_label) << "</text>\n";
  int legend_row = 0;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\" points=\"";
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y)) svg << px(x) << "," << py(y) << " ";
    }
    svg << "\"/>\n";
    if (s.points.size() <= 64) {  // sparse series (evaluations) get markers
      for (const auto& [x, y] : s.points) {
        if (std::isfinite(x) && std::isfinite(y)) {
          svg << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"2.5\" fill=\"" << s.color << "\"/>\n";
        }
      }
    }
    const double ly = top + 14 + 18 * legend_row++;
    svg << "<line x1=\"" << left + plot_w + 12 << "\" y1=\"" << ly << "\" x2=\"" << left + plot_w + 34 << "\" y2=\""
        << ly << "\" stroke=\"" << s.color << "\" stroke-width=\"2\"/>\n";
    svg << "<text x=\"" << left + plot_w + 40 << "\" y=\"" << ly + 4 << "\">" << escape(s.name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace microllm::train
