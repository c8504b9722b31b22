#include "microllm/profile/heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "microllm/core/error.h"
#include "svg.h"

namespace microllm::profile {

namespace {
// White (0) to dark blue (1), linear in each channel.
std::string shade(double t) {
  t = std::clamp(std::isnan(t) ? 0.0 : t, 0.0, 1.0);
  char color[8];
  std::snprintf(color, sizeof color, "#%02x%02x%02x", static_cast<int>(255 - t * (255 - 8)),
                static_cast<int>(255 - t * (255 - 48)), static_cast<int>(255 - t * (255 - 107)));
  return color;
}

std::string label(const std::vector<std::string>& labels, int64_t i) {
  return labels.empty() ? std::to_string(i) : labels[static_cast<size_t>(i)];
}
}  // namespace

std::string heatmap_svg(const std::vector<float>& values, int64_t rows, int64_t columns,
                        const std::vector<std::string>& row_labels, const std::vector<std::string>& column_labels,
                        const std::string& title) {
  MICROLLM_CHECK(rows > 0 && columns > 0 && static_cast<int64_t>(values.size()) == rows * columns, ShapeError,
                 "heatmap_svg", values.size(), " values do not fill ", rows, " x ", columns);
  MICROLLM_CHECK(row_labels.empty() || static_cast<int64_t>(row_labels.size()) == rows, ValueError, "heatmap_svg",
                 row_labels.size(), " row labels for ", rows, " rows");
  MICROLLM_CHECK(column_labels.empty() || static_cast<int64_t>(column_labels.size()) == columns, ValueError,
                 "heatmap_svg", column_labels.size(), " column labels for ", columns, " columns");
  const double cell = std::clamp(640.0 / static_cast<double>(std::max(rows, columns)), 4.0, 28.0);
  size_t longest = 1;
  for (const auto* labels : {&row_labels, &column_labels}) {
    for (const std::string& l : *labels) longest = std::max(longest, l.size());
  }
  const double margin = std::min(12.0 + 6.5 * static_cast<double>(longest), 200.0), top = 40;
  const double width = margin + cell * static_cast<double>(columns) + 90;
  const double height = top + margin + cell * static_cast<double>(rows) + 20;
  const double top_of_cells = top + margin;
  const double font = std::clamp(cell * 0.7, 6.0, 11.0);
  const float largest = std::max(*std::max_element(values.begin(), values.end()), 1e-30F);

  svg::Picture picture(width, height);
  picture.text(width / 2, 22, title, 14, "middle");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      const float v = values[static_cast<size_t>(r * columns + c)];
      char tip[96];
      std::snprintf(tip, sizeof tip, "%s -> %s: %.4g", label(row_labels, r).c_str(), label(column_labels, c).c_str(),
                    static_cast<double>(v));
      picture.rect(margin + cell * static_cast<double>(c), top_of_cells + cell * static_cast<double>(r), cell, cell,
                   shade(v / largest), tip);
    }
  }
  if (cell >= 6) {  // labels are legible only above a few pixels a cell
    for (int64_t r = 0; r < rows; ++r) {
      picture.text(margin - 4, top_of_cells + cell * (static_cast<double>(r) + 0.5) + font / 3, label(row_labels, r),
                   font, "end");
    }
    for (int64_t c = 0; c < columns; ++c) {
      const double x = margin + cell * (static_cast<double>(c) + 0.5) + font / 3;
      picture.text(x, top_of_cells - 4, label(column_labels, c), font, "start", -90);
    }
  }
  const double legend_x = margin + cell * static_cast<double>(columns) + 24;
  for (int i = 0; i < 10; ++i) {
    picture.rect(legend_x, top_of_cells + 12.0 * (9 - i), 14, 12, shade((i + 0.5) / 10));
  }
  char top_value[32];
  std::snprintf(top_value, sizeof top_value, "%.3g", static_cast<double>(largest));
  picture.text(legend_x + 18, top_of_cells + 10, top_value, 10);
  picture.text(legend_x + 18, top_of_cells + 120, "0", 10);
  return picture.str();
}

}  // namespace microllm::profile
