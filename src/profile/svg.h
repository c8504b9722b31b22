// A few SVG elements as text, for the plots of profile/ (alignment by depth, attention heat maps). Coordinates
// are user units of a viewBox the size of the picture.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace microllm::profile::svg {

// Text with &, <, >, " and ' escaped.
std::string escape(std::string_view text);

class Picture {
 public:
  Picture(double width, double height);
  // title: a tooltip ("" for none).
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& title = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& extra = "");
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                const std::string& extra = "");
  void circle(double x, double y, double r, const std::string& fill, const std::string& title = "");
  // anchor: start, middle or end; rotate: degrees about (x, y).
  void text(double x, double y, std::string_view content, double size = 11, const std::string& anchor = "start",
            double rotate = 0);
  std::string str() const;

 private:
  double width_, height_;
  std::string body_;
};

}  // namespace microllm::profile::svg
