// Gated activations: SwiGLU values against a direct f64 formula on every dtype and layout, its
// backward against finite differences, and contract errors.
#include "microllm/ops/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

class ActivationTest : public testing::DeviceTest {};

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

double silu(double x) { return x / (1 + std::exp(-x)); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Layouts of a rank-3 tensor holding the same values.
std::vector<Tensor> layouts(const Tensor& x) {
  return {x, testing::non_contiguous(x), x.transpose(0, 2).contiguous().transpose(0, 2),
          x.permute({2, 0, 1}).contiguous().permute({1, 2, 0})};
}

TEST_P(ActivationTest, SwigluMatchesReferenceOnEveryDtypeAndLayout) {
  for (DType dtype : kFloatTypes) {
    const Tensor gate = random_tensor({3, 5, 7}, dtype, device(), -6, 6);
    const Tensor up = random_tensor({3, 5, 7}, dtype, device(), -2, 2);
    const std::vector<double> gv = host_values(gate), uv = host_values(up);
    std::vector<double> ref;
    for (size_t i = 0; i < gv.size(); ++i) ref.push_back(silu(gv[i]) * uv[i]);
    for (const Tensor& g : layouts(gate)) {
      for (const Tensor& u : layouts(up)) {
        const Tensor out = swiglu(g, u);
        ASSERT_EQ(out.shape(), gate.shape());
        ASSERT_EQ(out.dtype(), dtype);
        ASSERT_TRUE(out.is_contiguous());
        MICROLLM_EXPECT_CLOSE(out, ref, tolerance(dtype))
            << dtype << " gate strides " << g.strides() << " up strides " << u.strides();
      }
    }
    // A permuted pair (same logical shape, different memory orders).
    const Tensor gp = random_tensor({7, 3, 5}, dtype, device(), -6, 6).permute({1, 2, 0});
    const Tensor up_p = random_tensor({3, 5, 7}, dtype, device());
    const std::vector<double> gpv = host_values(gp), upv = host_values(up_p);
    std::vector<double> ref_p;
    for (size_t i = 0; i < gpv.size(); ++i) ref_p.push_back(silu(gpv[i]) * upv[i]);
    MICROLLM_EXPECT_CLOSE(swiglu(gp, up_p), ref_p, tolerance(dtype)) << dtype;
  }
  // Large magnitudes saturate cleanly: silu(x) -> x for x >> 0 and -> 0 for x << 0, never NaN.
  const Tensor gate = Tensor::from_vector<float>({-100, -30, 0, 30, 100}, {5}).to(device());
  const Tensor up = Tensor::ones({5}, DType::f32, device());
  MICROLLM_EXPECT_CLOSE(swiglu(gate, up), (std::vector<double>{silu(-100), silu(-30), 0, silu(30), 100}),
                        tolerance(DType::f32));
  EXPECT_EQ(swiglu(Tensor::zeros({0, 4}, DType::f32, device()), Tensor::zeros({0, 4}, DType::f32, device())).shape(),
            (Shape{0, 4}));
}

// The two halves of a fused gate_up product ([.., 2n] narrowed: rows 2n apart, the prefill's case, which CUDA
// runs in 16-byte packs along each row), and row lengths that are not a whole pack (the strided kernel).
TEST_P(ActivationTest, SwigluOfTheHalvesOfOneProduct) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : {64, 72, 13}) {
      const Tensor gate_up = random_tensor({2, 9, 2 * n}, dtype, device(), -6, 6);
      const Tensor gate = gate_up.narrow(2, 0, n), up = gate_up.narrow(2, n, n);
      const std::vector<double> gv = host_values(gate), uv = host_values(up);
      std::vector<double> ref;
      for (size_t i = 0; i < gv.size(); ++i) ref.push_back(silu(gv[i]) * uv[i]);
      MICROLLM_EXPECT_CLOSE(swiglu(gate, up), ref, tolerance(dtype)) << dtype << " n " << n;
    }
  }
}

TEST_P(ActivationTest, SwigluBackwardMatchesTheFormula) {
  for (DType dtype : kFloatTypes) {
    const Tensor gate = random_tensor({4, 9}, dtype, device(), -5, 5);
    const Tensor up = random_tensor({4, 9}, dtype, device());
    const Tensor grad = random_tensor({4, 9}, dtype, device());
    const std::vector<double> gv = host_values(gate), uv = host_values(up), dv = host_values(grad);
    std::vector<double> ref_gate, ref_up;
    for (size_t i = 0; i < gv.size(); ++i) {
      const double s = sigmoid(gv[i]);
      ref_gate.push_back(dv[i] * uv[i] * (s + gv[i] * s * (1 - s)));
      ref_up.push_back(dv[i] * silu(gv[i]));
    }
    for (const Tensor& g : {gate, testing::non_contiguous(gate), gate.t().contiguous().t()}) {
      for (const Tensor& d : {grad, testing::non_contiguous(grad)}) {
        const SwigluGrads grads = swiglu_backward(g, testing::non_contiguous(up), d);
        ASSERT_EQ(grads.grad_gate.shape(), gate.shape());
        ASSERT_EQ(grads.grad_up.dtype(), dtype);
        MICROLLM_EXPECT_CLOSE(grads.grad_gate, ref_gate, tolerance(dtype)) << dtype;
        MICROLLM_EXPECT_CLOSE(grads.grad_up, ref_up, tolerance(dtype)) << dtype;
      }
    }
  }
}

TEST_P(ActivationTest, SwigluGradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor gate = random_tensor({3, 7}, DType::f64, Device::cpu(), -4, 4);
  const Tensor up = random_tensor({3, 7}, DType::f64);
  testing::expect_gradients_match(
      {gate, up}, [&](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        const SwigluGrads grads = swiglu_backward(in[0], in[1], g);
        return std::vector<Tensor>{grads.grad_gate, grads.grad_up};
      });
  // Through transposed views of the inputs.
  testing::expect_gradients_match(
      {gate, up}, [&](const std::vector<Tensor>& in) { return swiglu(in[0].t(), in[1].t()); },
      [&](const std::vector<Tensor>& in, const Tensor& g) {
        const SwigluGrads grads = swiglu_backward(in[0].t(), in[1].t(), g);
        return std::vector<Tensor>{grads.grad_gate.t(), grads.grad_up.t()};
      });
}

TEST_P(ActivationTest, ContractErrorsNameTheOp) {
  const Tensor a = random_tensor({2, 3}, DType::f32, device());
  testing::expect_op_error([&] { swiglu(a, random_tensor({3, 2}, DType::f32, device())); }, "swiglu");
  testing::expect_op_error([&] { swiglu(a, random_tensor({3}, DType::f32, device())); }, "swiglu");  // no broadcasting
  testing::expect_op_error([&] { swiglu(a, a.to(DType::f16)); }, "swiglu");
  testing::expect_op_error([&] { swiglu(a.to(DType::i32), a.to(DType::i32)); }, "swiglu");
  testing::expect_op_error([&] { swiglu(Tensor(), a); }, "swiglu");
  testing::expect_op_error([&] { swiglu(a, Tensor()); }, "swiglu");
  testing::expect_op_error([&] { swiglu_backward(a, a, a.t()); }, "swiglu_backward");
  testing::expect_op_error([&] { swiglu_backward(a, a, a.to(DType::f64)); }, "swiglu_backward");
  testing::expect_op_error([&] { swiglu_backward(a, a.view({3, 2}), a); }, "swiglu_backward");
  EXPECT_THROW(swiglu(a, random_tensor({3, 2}, DType::f32, device())), ShapeError);
  EXPECT_THROW(swiglu(a, a.to(DType::bf16)), DTypeError);
  EXPECT_THROW(swiglu(a.to(DType::f8_e4m3fn), a.to(DType::f8_e4m3fn)), DTypeError);
}

INSTANTIATE_TEST_SUITE_P(Devices, ActivationTest, ::testing::ValuesIn(testing::test_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace microllm
