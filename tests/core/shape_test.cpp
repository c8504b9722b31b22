// Dims/Shape: construction limits, element counts (and their overflow), broadcasting, dim normalization
// and contiguous strides.
#include "microllm/core/shape.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "microllm/core/error.h"
#include "test_support.h"

namespace microllm {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Shape, ConstructionAndAccess) {
  const Shape empty;
  EXPECT_EQ(empty.size(), 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.str(), "[]");
  const Shape s{2, 7, 896};
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s[1], 7);
  EXPECT_EQ(s.back(), 896);
  EXPECT_EQ(s.str(), "[2, 7, 896]");
  EXPECT_EQ(s.to_vector(), (std::vector<int64_t>{2, 7, 896}));
  EXPECT_EQ(Shape(std::vector<int64_t>{2, 7, 896}), s);
  EXPECT_FALSE(s == (Shape{2, 7}));
  EXPECT_FALSE(s == (Shape{2, 7, 895}));
  std::ostringstream out;
  out << s;
  EXPECT_EQ(out.str(), "[2, 7, 896]");
  int64_t total = 0;
  for (int64_t v : s) total += v;
  EXPECT_EQ(total, 905);
}

TEST(Shape, RankIsLimitedToEight) {
  EXPECT_NO_THROW(Shape({1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_THROW(Shape({1, 2, 3, 4, 5, 6, 7, 8, 9}), ShapeError);
  EXPECT_THROW(Shape(std::vector<int64_t>(9, 1)), ShapeError);
  Shape s{1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_THROW(s.push_back(9), ShapeError);
  EXPECT_THROW(s.insert(0, 9), ShapeError);
}

TEST(Shape, PushInsertErase) {
  Shape s;
  s.push_back(3);
  s.push_back(5);
  s.insert(0, 2);
  s.insert(3, 7);
  s.insert(2, 4);
  EXPECT_EQ(s, (Shape{2, 3, 4, 5, 7}));
  s.erase(0);
  s.erase(3);
  s.erase(1);
  EXPECT_EQ(s, (Shape{3, 5}));
  EXPECT_THROW(s.erase(2), IndexError);
  EXPECT_THROW(s.erase(-1), IndexError);
  EXPECT_THROW(s.insert(3, 1), IndexError);
  EXPECT_THROW(s.insert(-1, 1), IndexError);
}

TEST(Shape, Numel) {
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{0}).numel(), 0);
  EXPECT_EQ((Shape{3, 0, 5}).numel(), 0);
  EXPECT_EQ((Shape{2, 7, 896}).numel(), 2 * 7 * 896);
  EXPECT_EQ((Shape{1 << 20, 1 << 20, 1 << 22}).numel(), int64_t{1} << 62);
  EXPECT_EQ((Shape{std::numeric_limits<int64_t>::max()}).numel(), std::numeric_limits<int64_t>::max());
  const std::string overflow = testing::thrown_message<ShapeError>([] {
    (void)(Shape{1 << 20, 1 << 20, 1 << 23}).numel();
  });
  EXPECT_TRUE(contains(overflow, "overflows")) << overflow;
  EXPECT_TRUE(contains(overflow, "[1048576, 1048576, 8388608]")) << overflow;
  EXPECT_THROW((void)(Shape{int64_t{1} << 32, int64_t{1} << 32}).numel(), ShapeError);
  EXPECT_THROW((void)(Shape{3, -1}).numel(), ShapeError);
  // A zero after an overflowing prefix: the running product already overflowed, which is reported.
  EXPECT_THROW((void)(Shape{int64_t{1} << 40, int64_t{1} << 40, 0}).numel(), ShapeError);
}

TEST(Shape, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides(Shape{}), Strides{});
  EXPECT_EQ(contiguous_strides(Shape{5}), (Strides{1}));
  EXPECT_EQ(contiguous_strides(Shape{2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides(Shape{2, 1, 4}), (Strides{4, 4, 1}));
  // A size-0 dim counts as 1 so the strides stay valid (PyTorch's rule).
  EXPECT_EQ(contiguous_strides(Shape{2, 0, 3}), (Strides{3, 3, 1}));
}

TEST(Shape, NormalizeDim) {
  EXPECT_EQ(normalize_dim(0, 3, "op"), 0);
  EXPECT_EQ(normalize_dim(2, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-1, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-3, 3, "op"), 0);
  for (int64_t bad : {int64_t{3}, int64_t{4}, int64_t{-4}, int64_t{-100}, int64_t{1} << 40}) {
    const std::string message = testing::thrown_message<IndexError>([&] { normalize_dim(bad, 3, "my_op"); });
    EXPECT_TRUE(contains(message, "[my_op]")) << message;
    EXPECT_TRUE(contains(message, std::to_string(bad))) << message;
    EXPECT_TRUE(contains(message, "rank 3")) << message;
  }
  EXPECT_THROW(normalize_dim(0, 0, "op"), IndexError);
}

TEST(Shape, BroadcastShapes) {
  EXPECT_EQ(broadcast_shapes({4, 1, 9}, {3, 1}, "op"), (Shape{4, 3, 9}));
  EXPECT_EQ(broadcast_shapes({3, 1}, {4, 1, 9}, "op"), (Shape{4, 3, 9}));
  EXPECT_EQ(broadcast_shapes({}, {2, 3}, "op"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {}, "op"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({}, {}, "op"), Shape{});
  EXPECT_EQ(broadcast_shapes({0}, {1}, "op"), (Shape{0}));
  EXPECT_EQ(broadcast_shapes({5, 0}, {1, 1}, "op"), (Shape{5, 0}));
  EXPECT_EQ(broadcast_shapes({1, 1, 1}, {7}, "op"), (Shape{1, 1, 7}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {2, 3}, "op"), (Shape{2, 3}));
  const std::string message = testing::thrown_message<ShapeError>([] { broadcast_shapes({2, 3}, {4, 3}, "add"); });
  EXPECT_TRUE(contains(message, "[add]")) << message;
  EXPECT_TRUE(contains(message, "[2, 3]")) << message;
  EXPECT_TRUE(contains(message, "[4, 3]")) << message;
  EXPECT_TRUE(contains(message, "2 vs 4")) << message;
  EXPECT_THROW(broadcast_shapes({0}, {2}, "op"), ShapeError);
  EXPECT_THROW(broadcast_shapes({3, 2}, {3}, "op"), ShapeError);
}

}  // namespace
}  // namespace microllm
