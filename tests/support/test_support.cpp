#include "test_support.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "microllm/core/cuda.h"

namespace microllm::testing {

std::vector<Device> test_devices() {
#ifdef MICROLLM_WITH_CUDA
  return {Device::cpu(), Device::cuda(0)};
#else
  return {Device::cpu()};
#endif
}

std::string device_test_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda" + std::to_string(info.param.index);
}

std::string cuda_dtype_test_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string("cuda_") + dtype_name(info.param);
}

namespace {
// MICROLLM_TEST_SEED=<seed a failure printed> makes a test binary's first fresh_seed() return that seed
// again, so a failure seen once (in CI, say) can be rerun with --gtest_filter on the one test.
uint64_t first_seed() {
  if (const char* env = std::getenv("MICROLLM_TEST_SEED"); env != nullptr && *env != '\0')
    return std::strtoull(env, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
}
}  // namespace

uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{first_seed()};
  const uint64_t seed = counter.fetch_add(0x9E3779B97F4A7C15ull);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

Tensor random_tensor(const Shape& shape, DType dtype, Device device, double low, double high, uint64_t seed) {
  Generator gen(seed);
  if (is_integral(dtype)) {
    Tensor values = Tensor::uniform(shape, gen, low, high, DType::f64);
    std::vector<double> v = values.to_vector<double>();
    for (double& x : v) x = std::floor(x);
    return Tensor::from_vector(v, shape).to(device, dtype);
  }
  return Tensor::uniform(shape, gen, low, high, dtype, device);
}

Tensor non_contiguous(const Tensor& t) {
  if (t.dim() == 0) return t;
  Shape wide = t.shape();
  wide[wide.size() - 1] *= 2;
  Tensor buffer = Tensor::full(wide, std::nan(""), t.dtype(), t.device());
  Tensor view = buffer.slice(-1, 0, wide.back(), 2);
  view.copy_(t);
  return view;
}

std::string index_error_message(Device device, const std::function<void()>& call) {
  try {
    call();
    if (device.is_cuda()) cuda::synchronize(device.index);
  } catch (const IndexError& e) {
    return e.what();
  }
  return "";
}

std::vector<double> host_values(const Tensor& t) { return t.to_vector<double>(); }

double relative_error(const Tensor& out, const std::vector<double>& ref) {
  const std::vector<double> got = host_values(out);
  if (got.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(ref[i])) return NAN;
    if (std::isinf(ref[i]) || std::isnan(ref[i])) {
      if (got[i] != ref[i] && !(std::isnan(got[i]) && std::isnan(ref[i]))) return INFINITY;
      continue;
    }
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

double relative_error(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) return INFINITY;
  return relative_error(out, host_values(ref));
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1e-2;
    default: return 0;
  }
}

void expect_gradients_match(const std::vector<Tensor>& inputs, const ForwardFn& forward, const BackwardFn& backward,
                            double eps, double tol) {
  std::vector<Tensor> base;
  for (const Tensor& t : inputs) base.push_back(t.clone());
  const Tensor out = forward(base);
  ASSERT_EQ(out.dtype(), DType::f64) << "gradcheck runs in f64";
  const Tensor weights = random_tensor(out.shape(), DType::f64, Device::cpu(), -1, 1);
  const std::vector<double> w = host_values(weights);
  auto loss = [&](const std::vector<Tensor>& xs) {
    const std::vector<double> y = host_values(forward(xs));
    double total = 0;
    for (size_t i = 0; i < y.size(); ++i) total += y[i] * w[i];
    return total;
  };
  const std::vector<Tensor> grads = backward(base, weights);
  ASSERT_EQ(grads.size(), inputs.size()) << "backward must return one gradient per input";
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!grads[k].defined()) {
      // Only inputs that cannot carry a gradient (ids, masks) may have none: a lost gradient fails here.
      EXPECT_FALSE(is_floating(inputs[k].dtype())) << "backward returned no gradient for floating input " << k;
      continue;
    }
    ASSERT_EQ(grads[k].shape(), inputs[k].shape()) << "gradient " << k << " has the wrong shape";
    const std::vector<double> analytic = host_values(grads[k]);
    double worst = 0;
    int64_t worst_index = -1;
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      std::vector<Tensor> plus = base, minus = base;
      plus[k] = base[k].clone();
      minus[k] = base[k].clone();
      plus[k].data<double>()[i] += eps;
      minus[k].data<double>()[i] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      const double error = std::abs(numeric - analytic[static_cast<size_t>(i)]) / (1 + std::abs(numeric));
      if (!(error <= worst)) {  // also catches NaN
        worst = error;
        worst_index = i;
      }
    }
    EXPECT_LE(worst, tol) << "input " << k << ": analytic and numeric gradients differ at element " << worst_index;
  }
}

}  // namespace microllm::testing
