#include "microllm/core/tensor.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace microllm {
namespace {

TEST(Tensor, ArangeViewAndTranspose) {
  Tensor t = Tensor::arange(6, DType::f32).view({2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  Tensor tt = t.t();
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

}  // namespace
}  // namespace microllm
