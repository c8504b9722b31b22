// Readable printing, truncated like PyTorch: at most 3 leading and 3 trailing entries per dim when a
// tensor has more than 1000 elements.
#include <cstdio>
#include <ostream>

#include "microllm/core/tensor.h"

namespace microllm {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Printer {
  const std::vector<double>& values;
  const Shape& shape;
  bool integral;
  bool summarize;
  std::string out;

  void element(double v) {
    char buffer[32];
    if (integral) std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(v));
    else std::snprintf(buffer, sizeof buffer, "%.4g", v);
    out += buffer;
  }

  // Prints the sub-tensor at `dim` whose first element is at flat index `base`.
  void block(int dim, int64_t base, int indent) {
    if (dim == shape.size()) {
      element(values[static_cast<size_t>(base)]);
      return;
    }
    int64_t inner = 1;
    for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
    out += "[";
    const int64_t n = shape[dim];
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        out += dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(static_cast<size_t>(indent + 1), ' ');
        i = n - kEdgeItems;
      }
      block(dim + 1, base + i * inner, indent + 1);
      if (i + 1 < n) out += dim + 1 == shape.size() ? ", " : ",\n" + std::string(static_cast<size_t>(indent + 1), ' ');
    }
    out += "]";
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  const std::vector<double> values = to_vector<double>();
  Printer printer{values, shape_, is_integral(dtype_), numel() > kSummarizeAbove, "tensor("};
  printer.block(0, 0, 7);
  return str_cat(printer.out, ", shape=", shape_, ", dtype=", dtype_, ", device=", device(), ")");
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.str(); }

}  // namespace microllm
