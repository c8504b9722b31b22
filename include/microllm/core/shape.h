// Shapes and strides: a small fixed-capacity list of int64 (no heap allocation per view).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

namespace microllm {

constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> values);
  explicit Dims(std::span<const int64_t> values);
  Dims(const std::vector<int64_t>& values) : Dims(std::span<const int64_t>(values)) {}  // NOLINT: implicit on purpose

  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t& operator[](int i) { return values_[i]; }
  int64_t operator[](int i) const { return values_[i]; }
  int64_t back() const { return values_[size_ - 1]; }
  const int64_t* begin() const { return values_.data(); }
  const int64_t* end() const { return values_.data() + size_; }
  int64_t* begin() { return values_.data(); }
  int64_t* end() { return values_.data() + size_; }
  const int64_t* data() const { return values_.data(); }

  void push_back(int64_t value);
  void insert(int position, int64_t value);
  void erase(int position);

  // Product of all entries (1 for rank 0). Throws if it overflows int64.
  int64_t numel() const;
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  std::string str() const;  // "[2, 7, 896]"

  friend bool operator==(const Dims& a, const Dims& b);

 private:
  std::array<int64_t, kMaxDims> values_{};
  int size_ = 0;
};

using Shape = Dims;
using Strides = Dims;  // in elements, not bytes

std::ostream& operator<<(std::ostream& out, const Dims& dims);

// Row-major (C-order) strides of a shape.
Strides contiguous_strides(const Shape& shape);
// Maps a possibly negative dim into [0, rank); throws IndexError naming `op` when out of range.
int normalize_dim(int64_t dim, int rank, const char* op);
// The broadcast of two shapes (NumPy rules); throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace microllm
