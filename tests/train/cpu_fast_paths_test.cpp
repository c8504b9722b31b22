// The CPU fast paths that training runs on, against the reference paths they bypass: the vectorized f32
// attention (attention_fast.cpp; a mask, even an all-ones one, or a strided head dim takes the reference
// loops) and matmuls split over threads (matmul.cpp), which must equal a single-threaded product.
#include <gtest/gtest.h>

#include <cstring>

#include "microllm/core/threads.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/matmul.h"
#include "test_support.h"

namespace microllm {
namespace {

using testing::random_tensor;

TEST(CpuFastPaths, AttentionMatchesTheReferenceLoops) {
  struct Case {
    int64_t T, S;
    AttentionParams params;
  };
  const Case cases[] = {{9, 9, {}},
                        {9, 9, {.causal = false}},
                        {3, 11, {.causal = true, .q_offset = 8}},
                        {1, 7, {.causal = true, .q_offset = 6}},
                        {5, 5, {.causal = true, .scale = 0.3}}};
  for (const Case& c : cases) {
    // [B, T, H, D] transposed to [B, H, T, D], as the model lays them out.
    const Tensor q = random_tensor({2, c.T, 4, 8}).transpose(1, 2);
    const Tensor k = random_tensor({2, c.S, 2, 8}).transpose(1, 2);
    const Tensor v = random_tensor({2, c.S, 2, 8}).transpose(1, 2);
    const Tensor grad_out = random_tensor({2, 4, c.T, 8});
    const Tensor ones = Tensor::ones({1, 1, 1, 1}, DType::u8);  // a mask forces the reference path
    const AttentionResult fast = attention(q, k, v, c.params);
    const AttentionResult ref = attention(q, k, v, c.params, ones);
    EXPECT_LE(testing::relative_error(fast.out, ref.out), 1e-6) << c.T << "x" << c.S;
    EXPECT_LE(testing::relative_error(fast.lse, ref.lse), 1e-6);
    const AttentionGrads gf = attention_backward(q, k, v, fast, grad_out, c.params);
    const AttentionGrads gr = attention_backward(q, k, v, ref, grad_out, c.params, ones);
    EXPECT_LE(testing::relative_error(gf.grad_q, gr.grad_q), 1e-5) << c.T << "x" << c.S;
    EXPECT_LE(testing::relative_error(gf.grad_k, gr.grad_k), 1e-5);
    EXPECT_LE(testing::relative_error(gf.grad_v, gr.grad_v), 1e-5);
  }
}

TEST(CpuFastPaths, SplitMatmulEqualsOneThreadAndF64) {
  const int saved = num_threads();
  for (auto [m, n, k] : {std::array<int64_t, 3>{300, 96, 64}, {16, 700, 64}, {128, 128, 2048}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = ta ? random_tensor({k, m}) : random_tensor({m, k});
        const Tensor b = tb ? random_tensor({n, k}) : random_tensor({k, n});
        set_num_threads(2);
        const Tensor split = matmul(a, b, ta, tb);
        set_num_threads(1);
        const Tensor single = matmul(a, b, ta, tb);
        EXPECT_EQ(std::memcmp(split.data_ptr(), single.data_ptr(), split.nbytes()), 0) << m << "x" << n << "x" << k;
        const Tensor exact = matmul(a.to(DType::f64), b.to(DType::f64), ta, tb);
        EXPECT_LE(testing::relative_error(split, exact), 1e-5);
      }
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace microllm
