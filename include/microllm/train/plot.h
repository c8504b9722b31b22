// A loss curve as a standalone SVG: the training loss and the validation loss against the step, on
// linear axes with ticks, a grid and a legend. No dependencies: the SVG is written by hand.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace microllm::train {

struct Series {
  std::string name;
  std::string color;                              // an SVG color, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (x, y)
};

std::string line_chart_svg(const std::vector<Series>& series, const std::string& title, const std::string& x_label,
                           const std::string& y_label, int width = 720, int height = 420);

}  // namespace microllm::train
