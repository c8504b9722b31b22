#include "microllm/core/shape.h"

#include <algorithm>
#include <ostream>

#include "microllm/core/error.h"

namespace microllm {

Dims::Dims(std::initializer_list<int64_t> values) : Dims(std::span<const int64_t>(values.begin(), values.size())) {}

Dims::Dims(std::span<const int64_t> values) {
  MICROLLM_CHECK(values.size() <= kMaxDims, ShapeError, "shape", "rank ", values.size(),
                 " exceeds the maximum of ", kMaxDims, " dims");
  std::copy(values.begin(), values.end(), values_.begin());
  size_ = static_cast<int>(values.size());
}

void Dims::push_back(int64_t value) {
  MICROLLM_CHECK(size_ < kMaxDims, ShapeError, "shape", "rank exceeds the maximum of ", kMaxDims, " dims");
  values_[size_++] = value;
}

void Dims::insert(int position, int64_t value) {
  MICROLLM_CHECK(size_ < kMaxDims, ShapeError, "shape", "rank exceeds the maximum of ", kMaxDims, " dims");
  MICROLLM_CHECK(position >= 0 && position <= size_, IndexError, "shape", "insert position ", position,
                 " outside [0, ", size_, "]");
  for (int i = size_; i > position; --i) values_[i] = values_[i - 1];
  values_[position] = value;
  ++size_;
}

void Dims::erase(int position) {
  MICROLLM_CHECK(position >= 0 && position < size_, IndexError, "shape", "erase position ", position,
                 " outside [0, ", size_, ")");
  for (int i = position; i + 1 < size_; ++i) values_[i] = values_[i + 1];
  --size_;
}

int64_t Dims::numel() const {
  int64_t n = 1;
  for (int64_t v : *this) {
    MICROLLM_CHECK(v >= 0, ShapeError, "shape", "negative size in ", str());
    MICROLLM_CHECK(!__builtin_mul_overflow(n, v, &n), ShapeError, "shape", "element count of ", str(),
                   " overflows int64");
  }
  return n;
}

std::string Dims::str() const {
  std::string out = "[";
  for (int i = 0; i < size_; ++i) {
    if (i) out += ", ";
    out += std::to_string(values_[i]);
  }
  return out + "]";
}

bool operator==(const Dims& a, const Dims& b) {
  return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
}

std::ostream& operator<<(std::ostream& out, const Dims& dims) { return out << dims.str(); }

Strides contiguous_strides(const Shape& shape) {
  Strides strides = shape;
  int64_t running = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int normalize_dim(int64_t dim, int rank, const char* op) {
  const int64_t normalized = dim < 0 ? dim + rank : dim;
  MICROLLM_CHECK(normalized >= 0 && normalized < rank, IndexError, op, "dim ", dim,
                 " is out of range for a tensor of rank ", rank);
  return static_cast<int>(normalized);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int rank = std::max(a.size(), b.size());
  Shape out;
  for (int i = 0; i < rank; ++i) {
    const int ia = a.size() - rank + i;
    const int ib = b.size() - rank + i;
    const int64_t da = ia >= 0 ? a[ia] : 1;
    const int64_t db = ib >= 0 ? b[ib] : 1;
    MICROLLM_CHECK(da == db || da == 1 || db == 1, ShapeError, op, "shapes ", a, " and ", b,
                   " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

}  // namespace microllm
