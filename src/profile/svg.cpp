#include "svg.h"

#include <cstdio>

namespace microllm::profile::svg {

namespace {
std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", v);
  return buffer;
}
}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

Picture::Picture(double width, double height) : width_(width), height_(height) {}

void Picture::rect(double x, double y, double w, double h, const std::string& fill, const std::string& title) {
  body_ += "<rect x=\"" + number(x) + "\" y=\"" + number(y) + "\" width=\"" + number(w) + "\" height=\"" +
           number(h) + "\" fill=\"" + fill + "\"" +
           (title.empty() ? "/>\n" : "><title>" + escape(title) + "</title></rect>\n");
}

void Picture::line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& extra) {
  body_ += "<line x1=\"" + number(x1) + "\" y1=\"" + number(y1) + "\" x2=\"" + number(x2) + "\" y2=\"" + number(y2) +
           "\" stroke=\"" + stroke + "\"" + (extra.empty() ? "" : " " + extra) + "/>\n";
}

void Picture::polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                       const std::string& extra) {
  std::string coordinates;
  for (const auto& [x, y] : points) coordinates += number(x) + "," + number(y) + " ";
  body_ += "<polyline fill=\"none\" stroke=\"" + stroke + "\" points=\"" + coordinates + "\"" +
           (extra.empty() ? "" : " " + extra) + "/>\n";
}

void Picture::circle(double x, double y, double r, const std::string& fill, const std::string& title) {
  body_ += "<circle cx=\"" + number(x) + "\" cy=\"" + number(y) + "\" r=\"" + number(r) + "\" fill=\"" + fill + "\">" +
           (title.empty() ? "" : "<title>" + escape(title) + "</title>") + "</circle>\n";
}

void Picture::text(double x, double y, std::string_view content, double size, const std::string& anchor,
                   double rotate) {
  body_ += "<text x=\"" + number(x) + "\" y=\"" + number(y) + "\" font-size=\"" + number(size) +
           "\" text-anchor=\"" + anchor + "\"" +
           (rotate != 0 ? " transform=\"rotate(" + number(rotate) + " " + number(x) + " " + number(y) + ")\"" : "") +
           ">" + escape(content) + "</text>\n";
}

std::string Picture::str() const {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(width_) + "\" height=\"" + number(height_) +
         "\" viewBox=\"0 0 " + number(width_) + " " + number(height_) +
         "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body_ + "</svg>\n";
}

}  // namespace microllm::profile::svg
