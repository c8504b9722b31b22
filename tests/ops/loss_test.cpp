// Cross-entropy: contract errors (targets out of range name their position), values and gradients against
// a direct f64 computation on fresh random inputs (odd sizes, non-contiguous logits, [B, T, V] inputs,
// ignored targets, i32 and i64 targets, every dtype), f64 finite differences, all-ignored batches.
#include "microllm/ops/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class CrossEntropyTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

struct Reference {
  double loss = 0;
  std::vector<double> grad;  // d loss / d logits, times grad_loss
};

// torch.nn.functional.cross_entropy(reduction='mean') in f64, from row-major [N, V] logits; the gradient
// is d(loss)/d(logits) scaled by grad_loss. All targets ignored: loss 0 (torch gives NaN), gradient 0.
Reference reference_cross_entropy(const std::vector<double>& x, const std::vector<double>& targets, int64_t V,
                                  int64_t ignore_index, double grad_loss) {
  const auto N = int64_t(targets.size());
  Reference r;
  r.grad.assign(x.size(), 0.0);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += int64_t(targets[n]) != ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    const auto t = int64_t(targets[n]);
    if (t == ignore_index) continue;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[n * V + v]);  // inputs are small: no max needed
    r.loss += (std::log(sum) - x[n * V + t]) / double(count);
    for (int64_t v = 0; v < V; ++v)
      r.grad[n * V + v] = grad_loss * (std::exp(x[n * V + v]) / sum - (v == t ? 1.0 : 0.0)) / double(count);
  }
  return r;
}

// Random targets in [0, V) of `shape`, with about a quarter replaced by ignore_index.
Tensor random_targets(const Shape& shape, int64_t V, DType dtype, Device device, int64_t ignore_index) {
  std::vector<double> t = host_values(random_tensor(shape, DType::f64, Device::cpu(), 0, double(V)));
  const std::vector<double> drop = host_values(random_tensor(shape, DType::f64));
  for (size_t n = 0; n < t.size(); ++n) t[n] = drop[n] > 0.5 ? double(ignore_index) : std::floor(t[n]);
  t[0] = 0;  // at least one kept target
  return Tensor::from_vector(t, shape).to(device, dtype);
}

TEST_P(CrossEntropyTest, MatchesReferenceOnEveryDtypeLayoutAndTargetType) {
  const int64_t N = 7, V = 11;
  for (DType dtype : kFloatTypes) {
    for (DType target_dtype : {DType::i32, DType::i64}) {
      const Tensor x = random_tensor({N, V}, dtype, device(), -3, 3);
      const Tensor transposed = random_tensor({V, N}, dtype, device(), -3, 3).t();  // [N, V], stride (1, N)
      const Tensor targets = random_targets({N}, V, target_dtype, device(), kIgnoreIndex);
      for (const Tensor& logits : {x, testing::non_contiguous(x), transposed}) {
        const Tensor loss = cross_entropy(logits, targets);
        ASSERT_EQ(loss.dim(), 0);
        ASSERT_EQ(loss.dtype(), dtype == DType::f64 ? DType::f64 : DType::f32);
        const Tensor grad_loss = Tensor::scalar(0.75, loss.dtype(), device());
        const Reference ref = reference_cross_entropy(host_values(logits), host_values(targets), V, kIgnoreIndex, 0.75);
        // The loss is f32 (f64) computed from exactly the logits' values: f32's bound holds for every dtype.
        MICROLLM_EXPECT_CLOSE(loss, std::vector<double>{ref.loss}, tolerance(loss.dtype())) << dtype;
        const Tensor grad = cross_entropy_backward(logits, targets, grad_loss);
        ASSERT_EQ(grad.shape(), logits.shape());
        ASSERT_EQ(grad.dtype(), dtype);
        MICROLLM_EXPECT_CLOSE(grad, ref.grad, tolerance(dtype)) << dtype;
      }
    }
  }
}

TEST_P(CrossEntropyTest, FlattensLeadingDimsAndHonoursACustomIgnoreIndex) {
  const int64_t B = 2, T = 3, V = 5;
  const Tensor logits = random_tensor({B, T, V}, DType::f32, device(), -2, 2);
  // ignore_index 0 (a padding token that is also a valid class): rows with target 0 drop out.
  const Tensor targets = Tensor::from_vector<int64_t>({0, 3, 4, 0, 1, 2}, {B, T}).to(device());
  const Tensor loss = cross_entropy(logits, targets, 0);
  const Reference ref = reference_cross_entropy(host_values(logits), host_values(targets), V, 0, 1.0);
  MICROLLM_EXPECT_CLOSE(loss, std::vector<double>{ref.loss}, tolerance(DType::f32));
  const Tensor grad = cross_entropy_backward(logits, targets, Tensor::scalar(1.0, DType::f32, device()), 0);
  ASSERT_EQ(grad.shape(), logits.shape());
  MICROLLM_EXPECT_CLOSE(grad, ref.grad, tolerance(DType::f32));
}

TEST_P(CrossEntropyTest, KnownValuesAndStability) {
  // Equal logits: the loss is log(V) whatever the target.
  const Tensor uniform = Tensor::zeros({3, 8}, DType::f32, device());
  const Tensor targets = Tensor::from_vector<int32_t>({1, 7, 0}, {3}).to(device());
  EXPECT_NEAR(cross_entropy(uniform, targets).item<float>(), std::log(8.0), 1e-6);
  // Logits of 1e4: exp overflows unless the row max comes out first. loss = log(1 + e^-1 + e^-2) + 0 / 1 / 2.
  const Tensor big = Tensor::from_vector<float>({1e4f, 1e4f - 1, 1e4f - 2}, {1, 3}).to(device());
  const double lse = std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  for (int64_t t = 0; t < 3; ++t) {
    const Tensor target = Tensor::from_vector<int64_t>({t}, {1}).to(device());
    EXPECT_NEAR(cross_entropy(big, target).item<float>(), lse + double(t), 1e-5) << t;
  }
}

TEST_P(CrossEntropyTest, AllTargetsIgnoredGivesZeroLossAndGradient) {
  const Tensor logits = random_tensor({4, 6}, DType::f32, device());
  const Tensor targets = Tensor::full({4}, -100, DType::i64, device());
  EXPECT_EQ(cross_entropy(logits, targets).item<float>(), 0.0f);
  const Tensor grad = cross_entropy_backward(logits, targets, Tensor::scalar(1.0, DType::f32, device()));
  for (double g : host_values(grad)) EXPECT_EQ(g, 0.0);
  EXPECT_EQ(cross_entropy(Tensor::zeros({0, 6}, DType::f32, device()), Tensor::zeros({0}, DType::i64, device()))
                .item<float>(),
            0.0f);
}

TEST_P(CrossEntropyTest, GradientsMatchFiniteDifferencesWithIgnoredTargets) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor targets = Tensor::from_vector<int64_t>({2, -100, 0, 4, -100, 1}, {2, 3});
  const Tensor logits = random_tensor({2, 3, 5}, DType::f64, Device::cpu(), -2, 2);
  testing::expect_gradients_match(
      {logits}, [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        return std::vector<Tensor>{cross_entropy_backward(in[0], targets, g)};
      });
}

TEST_P(CrossEntropyTest, ContractErrorsNameTheOpAndPosition) {
  const Tensor logits = random_tensor({4, 5}, DType::f32, device());
  const Tensor targets = Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4}).to(device());
  const Tensor one = Tensor::scalar(1.0, DType::f32, device());
  const auto message = testing::error_message;
  EXPECT_THROW(cross_entropy(Tensor::zeros({4, 5}, DType::i32, device()), targets), DTypeError);
  EXPECT_THROW(cross_entropy(logits, targets.to(DType::f32)), DTypeError);
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({5}, DType::i64, device())), ShapeError);
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({4, 1}, DType::i64, device())), ShapeError);
  EXPECT_THROW(cross_entropy(Tensor::scalar(1.0, DType::f32, device()), targets), ShapeError);
  EXPECT_THROW(cross_entropy(Tensor::zeros({4, 0}, DType::f32, device()), targets), ShapeError);
  EXPECT_THROW(cross_entropy_backward(logits, targets, Tensor::ones({1}, DType::f32, device())), ShapeError);
  EXPECT_THROW(cross_entropy_backward(logits, targets, Tensor()), ValueError);
  const Tensor bad = Tensor::from_vector<int32_t>({0, 1, 2, 5}, {4}).to(device());
  // Bad targets: the CPU names the position at once; CUDA kernels report at the next synchronization.
  const std::string range_error = testing::index_error_message(device(), [&] { cross_entropy(logits, bad); });
  EXPECT_NE(range_error.find(device().is_cpu() ? "[cross_entropy]" : "cross_entropy"), std::string::npos) << range_error;
  EXPECT_NE(range_error.find(device().is_cpu() ? "position 3" : "5"), std::string::npos) << range_error;
  EXPECT_FALSE(testing::index_error_message(device(), [&] { cross_entropy_backward(logits, bad, one); }).empty());
  const std::string negative = testing::index_error_message(
      device(), [&] { cross_entropy(logits, Tensor::full({4}, -1, DType::i64, device())); });
  EXPECT_NE(negative.find(device().is_cpu() ? "position 0" : "-1"), std::string::npos) << negative;
  const std::string backward_error = message([&] { cross_entropy_backward(logits, targets, logits); });
  EXPECT_NE(backward_error.find("[cross_entropy_backward]"), std::string::npos) << backward_error;
}

INSTANTIATE_TEST_SUITE_P(Devices, CrossEntropyTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
