// The autograd engine: accumulation, graph reuse, grad mode, detach, released saved tensors, errors,
// and a gradcheck of every differentiable function.
#include <gtest/gtest.h>

#include "microllm/autograd/functions.h"
#include "microllm/autograd/gradcheck.h"
#include "microllm/ops/ops.h"
#include "test_support.h"

namespace microllm::autograd {
namespace {

using microllm::testing::random_tensor;
using Vars = std::vector<Variable>;

Tensor f64(const Shape& shape, double lo = -1, double hi = 1) { return random_tensor(shape, DType::f64, Device::cpu(), lo, hi); }

void expect_gradcheck(const std::function<Variable(const Vars&)>& fn, const std::vector<Tensor>& inputs) {
  const GradcheckResult r = gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Autograd, LeafAccumulatesAndReusedInputsSumTheirPaths) {
  Variable x(Tensor::from_vector<double>({2, 3}, {2}), true);
  // y = x * x + x: dy/dx = 2x + 1, x used on three paths.
  Variable y = sum(add(mul(x, x), x));
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7}));
  // A second graph accumulates into the same leaf.
  sum(scale(x, 10)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{15, 17}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

// A leaf reached twice in one pass gets grad += (c1 + c2), not (grad + c1) + c2: accumulating micro-batches
// then adds each pass's sum, as data parallelism adds each rank's (bit-equal results; see ddp_test.cpp).
// In f32: (1 + 2^-24) + 2^-24 rounds to 1 twice, 1 + (2^-24 + 2^-24) = 1 + 2^-23.
TEST(Autograd, ALeafAddsTheSumOfItsPassOnce) {
  Variable w(Tensor::from_vector<float>({1}, {1}), true);
  const Variable one(Tensor::from_vector<float>({1}, {1}), false);
  const Variable tiny(Tensor::from_vector<float>({0x1p-24f}, {1}), false);
  sum(mul(w, one)).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>{1});
  sum(add(mul(w, tiny), mul(w, tiny))).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>{1 + 0x1p-23f});
}

TEST(Autograd, NoGradDetachAndLeavesWithoutGrad) {
  Variable w(f64({3}), true);
  Variable c(f64({3}), false);
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    EXPECT_FALSE(mul(w, c).requires_grad());
  }
  EXPECT_TRUE(grad_enabled());
  Variable y = sum(mul(w.detach(), c));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), ValueError);
  Variable z = sum(mul(w, c));
  z.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), c.value().to_vector<double>());
  EXPECT_FALSE(c.grad().defined());
}

TEST(Autograd, SavedTensorsAreReleasedAndASecondBackwardIsAnError) {
  Variable x(f64({4, 4}), true);
  Variable hidden = silu(x);          // saves x's value
  std::weak_ptr<Storage> saved = hidden.value().storage();
  Variable y = sum(mul(hidden, hidden));  // mul saves hidden's value twice
  hidden = Variable();                     // the user's handle is gone; the graph still holds the value
  EXPECT_FALSE(saved.expired());
  y.backward();
  EXPECT_TRUE(saved.expired()) << "the graph kept a saved tensor alive after backward";
  EXPECT_THROW(y.backward(), ValueError);
}

TEST(Autograd, ShapeErrorsNameTheOp) {
  Variable x(f64({2, 3}), true);
  EXPECT_THROW(x.backward(), ShapeError);  // not a scalar and no grad_output
  Variable y = mul(x, x);
  EXPECT_THROW(y.backward(Tensor::ones({3}, DType::f64)), ShapeError);
  EXPECT_THROW(Variable(Tensor::zeros({2}, DType::i64), true), DTypeError);
}

TEST(Autograd, ElementwiseReductionAndShapeFunctions) {
  expect_gradcheck([](const Vars& v) { return mul(silu(v[0]), gelu(v[1], true)); }, {f64({3, 4}), f64({4})});
  expect_gradcheck([](const Vars& v) { return div(exp(v[0]), add(square(v[1]), v[0])); }, {f64({2, 3}, 0.5, 1),
                   f64({2, 3}, 0.5, 1)});
  expect_gradcheck([](const Vars& v) { return mean(sum(v[0], {1}, true), {0}); }, {f64({3, 4, 2})});
  expect_gradcheck([](const Vars& v) { return reshape(transpose(permute(v[0], {2, 0, 1}), 0, 2), {-1}); }, {f64({2, 3, 4})});
  expect_gradcheck([](const Vars& v) { return narrow(unsqueeze(v[0], 0), 2, 1, 2); }, {f64({3, 4})});
  expect_gradcheck([](const Vars& v) { return mul(expand(v[0], {3, 4}), v[1]); }, {f64({1, 4}), f64({3, 4})});
  expect_gradcheck([](const Vars& v) { return concat({v[0], v[1]}, 1); }, {f64({2, 3}), f64({2, 1})});
  expect_gradcheck([](const Vars& v) { return split(v[0], {1, 3}, 1)[1]; }, {f64({2, 4})});  // piece 0 unused
  const Tensor mask = Tensor::from_vector<uint8_t>({1, 0, 0, 1}, {4});
  expect_gradcheck([&](const Vars& v) { return add(where(mask, v[0], v[1]), masked_fill(v[0], mask, 3)); }, {f64({2, 4}), f64({4})});
}

TEST(Autograd, ModelFunctions) {
  expect_gradcheck([](const Vars& v) { return linear(v[0], v[1], v[2]); }, {f64({2, 3, 5}), f64({4, 5}), f64({4})});
  expect_gradcheck([](const Vars& v) { return matmul(v[0], v[1], true, false); }, {f64({5, 3}), f64({5, 2})});
  const Tensor ids = Tensor::from_vector<int64_t>({1, 3, 1, 0}, {2, 2});
  expect_gradcheck([&](const Vars& v) { return embedding(v[0], ids); }, {f64({4, 3})});
  expect_gradcheck([](const Vars& v) { return rms_norm(v[0], v[1], 1e-6); }, {f64({3, 8}), f64({8}, 0.5, 1.5)});
  // Both outputs of the fused norm carry gradient: y feeds the loss, and h (the residual stream) too.
  expect_gradcheck([](const Vars& v) {
        auto [y, h] = rms_norm_residual(v[0], v[1], v[2], 1e-6);
        return add(y, scale(h, 0.3));
      }, {f64({2, 8}), f64({2, 8}), f64({8}, 0.5, 1.5)});
  const Tensor positions = Tensor::from_vector<int64_t>({3, 4, 5}, {3});
  expect_gradcheck([&](const Vars& v) { return rope(v[0], positions, RopeParams{}); }, {f64({2, 3, 2, 4})});
  expect_gradcheck([](const Vars& v) { return swiglu(v[0], v[1]); }, {f64({3, 5}), f64({3, 5})});
  expect_gradcheck([](const Vars& v) { return log_softmax(softmax(v[0], 0)); }, {f64({3, 5})});
  expect_gradcheck([](const Vars& v) {
        return attention(transpose(v[0], 1, 2), transpose(v[1], 1, 2), transpose(v[2], 1, 2));
      }, {f64({1, 5, 4, 3}), f64({1, 5, 2, 3}), f64({1, 5, 2, 3})});
  const Tensor targets = Tensor::from_vector<int64_t>({2, -100, 0, 4}, {4});
  expect_gradcheck([&](const Vars& v) { return cross_entropy(v[0], targets); }, {f64({4, 5}, -3, 3)});
  // f64 -> f32 -> f64: the finite difference needs a step far above f32's resolution.
  const GradcheckResult cast_check =
      gradcheck([](const Vars& v) { return cast(cast(v[0], DType::f32), DType::f64); }, {f64({3})}, 1e-2, 1e-5);
  EXPECT_TRUE(cast_check.ok) << cast_check.message;
}

TEST(Autograd, GradcheckCatchesAWrongBackward) {
  // A function whose recorded backward is deliberately wrong must fail the check.
  auto wrong = [](const Vars& v) {
    const Tensor x = v[0].value();
    return record("wrong_square", microllm::square(x), {v[0]},
                  [x](const std::vector<Tensor>& g) { return std::vector<Tensor>{microllm::mul(g[0], x)}; });
  };
  EXPECT_FALSE(gradcheck(wrong, {f64({4})}).ok);
}

}  // namespace
}  // namespace microllm::autograd
