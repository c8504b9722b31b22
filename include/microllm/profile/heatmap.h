// A matrix as an SVG heat map: white at 0 to dark blue at the largest value, each cell's value in its tooltip,
// labels along both axes (attention weights of a head: queries down, keys across; `microllm attention --svg`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace microllm::profile {

// values: rows x columns, row-major. Labels may be empty (then indices) or one per row / column.
std::string heatmap_svg(const std::vector<float>& values, int64_t rows, int64_t columns,
                        const std::vector<std::string>& row_labels, const std::vector<std::string>& column_labels,
                        const std::string& title);

}  // namespace microllm::profile
