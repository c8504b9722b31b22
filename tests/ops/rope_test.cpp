// Rotary embedding: contract errors, inverse frequencies against Hugging Face's formulas written here in f64,
// values against a direct f64 rotation (both layouts, every scaling, every dtype, strided x, [T] and [B, T]
// positions not starting at 0), rope_backward inverting rope, and f64 finite-difference gradients.
#include "microllm/ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "test_support.h"

namespace microllm {
namespace {

using testing::host_values;
using testing::random_tensor;
using testing::tolerance;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
const RopeLayout kLayouts[] = {RopeLayout::split_half, RopeLayout::interleaved};

class RopeTest : public testing::DeviceTest {};

RopeParams plain_params(RopeLayout layout = RopeLayout::split_half) {
  RopeParams p;
  p.theta = 10000;
  p.layout = layout;
  return p;
}

// theta 10000 with a scaling of `type` (factor, original length).
RopeParams scaled_params(RopeLayout layout, RopeScalingType type, double factor, int64_t original = 8192) {
  RopeParams p = plain_params(layout);
  p.scaling.type = type;
  p.scaling.factor = factor;
  p.scaling.original_max_position_embeddings = original;
  return p;
}

RopeParams linear_params(RopeLayout layout = RopeLayout::split_half) {
  return scaled_params(layout, RopeScalingType::linear, 2.5);
}

// Llama 3.1's settings; with D = 16 its frequencies fall in all three bands (checked below).
RopeParams llama3_params(RopeLayout layout = RopeLayout::split_half) {
  RopeParams p;
  p.theta = 500000;
  p.layout = layout;
  p.scaling = {RopeScalingType::llama3, 8.0, 1.0, 4.0, 8192};
  return p;
}

// yarn (Qwen2.5's long-context settings, scaled down: D = 16 has kept, divided and ramped frequencies).
RopeParams yarn_params(RopeLayout layout = RopeLayout::split_half) {
  return scaled_params(layout, RopeScalingType::yarn, 4.0, 2048);
}

// longrope: one divisor per rotary pair (D = 16: 8 of them).
RopeParams longrope_params(RopeLayout layout = RopeLayout::split_half) {
  RopeParams p = scaled_params(layout, RopeScalingType::longrope, 32, 4096);
  for (int i = 0; i < 8; ++i) p.scaling.frequency_factors.push_back(1.0 + 0.37 * i * i);
  return p;
}

// transformers' rope init functions in f64, in the if/else form of Meta's apply_scaling.
std::vector<double> reference_inv_freq(const RopeParams& p, int64_t dim, int* bands_hit = nullptr) {
  std::vector<double> freq;
  for (int64_t i = 0; i < dim; i += 2) freq.push_back(1 / std::pow(p.theta, static_cast<double>(i) / dim));
  const RopeScaling& s = p.scaling;
  if (s.type == RopeScalingType::linear) {
    for (double& f : freq) f /= s.factor;
  } else if (s.type == RopeScalingType::llama3) {
    const double old = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
    bool hit[3] = {false, false, false};
    for (double& f : freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_wavelen) {
        hit[0] = true;
      } else if (wavelen > low_wavelen) {
        f /= s.factor;
        hit[1] = true;
      } else {
        const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
        hit[2] = true;
      }
    }
    if (bands_hit) *bands_hit = hit[0] + hit[1] + hit[2];
  } else if (s.type == RopeScalingType::yarn) {
    // Pair i keeps its frequency below the dimension where it turns beta_fast times over the original context,
    // is divided by factor above the one where it turns beta_slow times, and blends linearly between.
    const double old = static_cast<double>(s.original_max_position_embeddings);
    const auto dim_of = [&](double turns) {
      return dim * std::log(old / (turns * 2 * M_PI)) / (2 * std::log(p.theta));
    };
    const double low = std::max(0.0, std::floor(dim_of(s.beta_fast)));
    const double high = std::min(static_cast<double>(dim - 1), std::ceil(dim_of(s.beta_slow)));
    bool hit[3] = {false, false, false};
    for (size_t i = 0; i < freq.size(); ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      hit[ramp == 0 ? 0 : ramp == 1 ? 1 : 2] = true;
      freq[i] = freq[i] / s.factor * ramp + freq[i] * (1 - ramp);
    }
    if (bands_hit) *bands_hit = hit[0] + hit[1] + hit[2];
  } else if (s.type == RopeScalingType::longrope) {
    for (size_t i = 0; i < freq.size(); ++i) freq[i] /= s.frequency_factors[i];
  }
  return freq;
}

// x row-major [B, T, H, D], positions row-major [B, T]; sign -1 rotates backwards.
std::vector<double> reference_rope(const std::vector<double>& x, const std::vector<double>& positions,
                                   const Shape& shape, const RopeParams& p, double sign = 1) {
  const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3];
  const std::vector<double> freq = reference_inv_freq(p, D);
  std::vector<double> out(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const int64_t base = ((b * T + t) * H + h) * D;
          const int64_t j0 = p.layout == RopeLayout::split_half ? i : 2 * i;
          const int64_t j1 = p.layout == RopeLayout::split_half ? i + D / 2 : 2 * i + 1;
          const double angle = sign * positions[b * T + t] * freq[i];
          out[base + j0] = x[base + j0] * std::cos(angle) - x[base + j1] * std::sin(angle);
          out[base + j1] = x[base + j1] * std::cos(angle) + x[base + j0] * std::sin(angle);
        }
  return out;
}

// The values of `x` [B, T, H, D] in three layouts: contiguous, a transpose of a [B, H, T, D] buffer, and
// every other element of the last dim.
std::vector<Tensor> layouts(const Tensor& x) {
  return {x, x.transpose(1, 2).contiguous().transpose(1, 2), testing::non_contiguous(x)};
}

TEST_P(RopeTest, ContractErrorsNameTheOpAndValues) {
  const Tensor x = Tensor::zeros({2, 5, 3, 8}, DType::f32, device());
  const Tensor pos = Tensor::arange(5, DType::i64, device());
  const RopeParams p = plain_params();
  EXPECT_NO_THROW(rope(x, pos, p));
  EXPECT_THROW(rope(Tensor::zeros({5, 3, 8}, DType::f32, device()), pos, p), ShapeError);
  EXPECT_THROW(rope(Tensor(), pos, p), ValueError);
  EXPECT_THROW(rope(Tensor::zeros({2, 5, 3, 8}, DType::i32, device()), pos, p), DTypeError);
  EXPECT_THROW(rope(x, Tensor::arange(0, 5, 1, DType::f32, device()), p), DTypeError);
  EXPECT_THROW(rope(x, Tensor(), p), ValueError);
  EXPECT_THROW(rope(x, Tensor::arange(6, DType::i64, device()), p), ShapeError);
  EXPECT_THROW(rope(x, Tensor::zeros({3, 5}, DType::i64, device()), p), ShapeError);
  EXPECT_THROW(rope(x, Tensor::zeros({2, 5, 1}, DType::i64, device()), p), ShapeError);
  try {
    rope(Tensor::zeros({2, 5, 3, 7}, DType::f32, device()), pos, p);
    ADD_FAILURE() << "an odd head dim must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rope]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("head dim must be even, got 7"), std::string::npos) << e.what();
  }
  try {
    rope(x, Tensor::arange(4, DType::i32, device()), p);
    ADD_FAILURE() << "positions of the wrong length must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rope] positions shape [4]"), std::string::npos) << e.what();
  }

  RopeParams bad = p;
  for (double theta : {0.0, -10.0, double(NAN), double(INFINITY)}) {
    bad.theta = theta;
    EXPECT_THROW(rope(x, pos, bad), ValueError) << theta;
    EXPECT_THROW(rope_inv_freq(bad, 8), ValueError) << theta;
  }
  bad = linear_params();
  bad.scaling.factor = 0;
  EXPECT_THROW(rope(x, pos, bad), ValueError);
  bad = llama3_params();
  bad.scaling.factor = -8;
  EXPECT_THROW(rope(x, pos, bad), ValueError);
  bad = llama3_params();
  bad.scaling.high_freq_factor = bad.scaling.low_freq_factor;
  try {
    rope(x, pos, bad);
    ADD_FAILURE() << "llama3 with high_freq_factor == low_freq_factor must throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[rope]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("high_freq_factor"), std::string::npos) << e.what();
  }
  bad = llama3_params();
  bad.scaling.original_max_position_embeddings = 0;
  EXPECT_THROW(rope(x, pos, bad), ValueError);
  // Without scaling the scaling fields are not used, so they are not checked.
  bad = plain_params();
  bad.scaling.factor = 0;
  EXPECT_NO_THROW(rope(x, pos, bad));

  EXPECT_THROW(rope_inv_freq(p, 7), ValueError);
  EXPECT_THROW(rope_inv_freq(p, 0), ValueError);
  try {
    rope_backward(Tensor::zeros({2, 5, 3}, DType::f32, device()), pos, p);
    ADD_FAILURE() << "a rank-3 gradient must throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rope_backward]"), std::string::npos) << e.what();
  }
}

TEST_P(RopeTest, InverseFrequenciesMatchHuggingFace) {
  // theta^(-2i/D) for theta = 10000, D = 4: exactly 1 and 1/100.
  const std::vector<float> simple = rope_inv_freq(plain_params(), 4);
  ASSERT_EQ(simple.size(), 2u);
  EXPECT_EQ(simple[0], 1.0f);
  EXPECT_FLOAT_EQ(simple[1], 0.01f);

  int bands = 0;
  reference_inv_freq(llama3_params(), 16, &bands);
  ASSERT_EQ(bands, 3) << "the llama3 test settings must reach the kept, the divided and the blended band";
  reference_inv_freq(yarn_params(), 16, &bands);
  ASSERT_EQ(bands, 3) << "the yarn test settings must reach the kept, the divided and the ramped pairs";
  RopeParams short_ctx = llama3_params();  // other factors, and a context where D = 128 has every band
  short_ctx.scaling = {RopeScalingType::llama3, 4.0, 2.0, 6.0, 4096};
  for (const RopeParams& p : {plain_params(), linear_params(), llama3_params(), short_ctx, yarn_params()}) {
    for (int64_t dim : {16, 64, 128}) {
      const std::vector<float> got = rope_inv_freq(p, dim);
      const std::vector<double> ref = reference_inv_freq(p, dim);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i])
            << "scaling " << static_cast<int>(p.scaling.type) << " D " << dim << " i " << i;
      }
    }
  }
  // dynamic: the default frequencies within the original length.
  const RopeParams dynamic = scaled_params(RopeLayout::split_half, RopeScalingType::dynamic, 4.0);
  EXPECT_EQ(rope_inv_freq(dynamic, 64), rope_inv_freq(plain_params(), 64));
  const std::vector<float> longrope = rope_inv_freq(longrope_params(), 16);
  const std::vector<double> longrope_ref = reference_inv_freq(longrope_params(), 16);
  for (size_t i = 0; i < longrope_ref.size(); ++i) EXPECT_NEAR(longrope[i], longrope_ref[i], 1e-5 * longrope_ref[i]);
  EXPECT_THROW(rope_inv_freq(longrope_params(), 32), ValueError);  // 8 factors for 16 pairs
}

TEST_P(RopeTest, MatchesReferenceOnEveryDtypeLayoutAndScaling) {
  const Shape shape{2, 5, 3, 16};
  int variant = 0;
  for (DType dtype : kFloatTypes) {
    for (RopeLayout layout : kLayouts) {
      for (const RopeParams& p : {plain_params(layout), linear_params(layout), llama3_params(layout),
                                  yarn_params(layout), longrope_params(layout)}) {
        const Tensor x = random_tensor(shape, dtype, device(), -2, 2);
        // [B, T] positions (different per batch, i64) or [T] positions from an offset (i32), both != 0-based.
        const bool per_batch = variant % 2 == 0;
        const Tensor positions = per_batch ? random_tensor({2, 5}, DType::i64, device(), 0, 60)
                                           : Tensor::arange(17, 22, 1, DType::i32, device());
        std::vector<double> pos_bt = host_values(positions);
        if (!per_batch) pos_bt.insert(pos_bt.end(), pos_bt.begin(), pos_bt.end());
        const std::vector<double> ref = reference_rope(host_values(x), pos_bt, shape, p);
        for (const Tensor& input : layouts(x)) {
          const Tensor y = rope(input, positions, p);
          ASSERT_EQ(y.shape(), shape);
          ASSERT_EQ(y.dtype(), dtype);
          ASSERT_TRUE(y.is_contiguous());
          MICROLLM_EXPECT_CLOSE(y, ref, tolerance(dtype))
              << dtype << " layout " << static_cast<int>(layout) << " scaling " << static_cast<int>(p.scaling.type);
        }
        ++variant;
      }
    }
  }
}

TEST_P(RopeTest, SharedPositionsEqualPerBatchPositions) {
  const Tensor x = random_tensor({3, 7, 2, 10}, DType::f32, device());
  const Tensor positions = Tensor::arange(100, 107, 1, DType::i64, device());
  const Tensor per_batch = positions.unsqueeze(0).expand({3, 7}).contiguous();
  for (RopeLayout layout : kLayouts) {
    const RopeParams p = plain_params(layout);
    EXPECT_EQ(host_values(rope(x, positions, p)), host_values(rope(x, per_batch, p)));
    // Position 0 is the identity; other positions are not.
    const Tensor zeros = Tensor::zeros({3, 7}, DType::i64, device());
    EXPECT_EQ(host_values(rope(x, zeros, p)), host_values(x));
    EXPECT_GT(testing::relative_error(rope(x, positions, p), x), 0.1);
  }
}

TEST_P(RopeTest, BackwardUndoesForward) {
  const Shape shape{2, 6, 3, 12};
  for (DType dtype : kFloatTypes) {
    for (RopeLayout layout : kLayouts) {
      for (const RopeParams& p : {plain_params(layout), llama3_params(layout)}) {
        const Tensor x = random_tensor(shape, dtype, device(), -2, 2);
        const Tensor positions = random_tensor({2, 6}, DType::i32, device(), 0, 5000);
        const Tensor y = rope(testing::non_contiguous(x), positions, p);
        const Tensor back = rope_backward(y.transpose(1, 2).contiguous().transpose(1, 2), positions, p);
        MICROLLM_EXPECT_CLOSE(back, x, 2 * tolerance(dtype)) << dtype << " layout " << static_cast<int>(layout);
        // ...and rope_backward is the rotation by -angle, against the reference. An f32 angle near 5000 is
        // off by up to ulp(5000) / 2 = 2.4e-4 from the f64 one, hence the f32 tolerance.
        const std::vector<double> ref = reference_rope(host_values(y), host_values(positions), shape, p, -1);
        MICROLLM_EXPECT_CLOSE(rope_backward(y, positions, p), ref, dtype == DType::f32 ? 1e-3 : tolerance(dtype));
      }
    }
  }
}

TEST_P(RopeTest, GradientsMatchFiniteDifferences) {
  if (!device().is_cpu()) GTEST_SKIP() << "gradcheck runs in f64 on the CPU";
  const Tensor positions = Tensor::from_vector<int64_t>({3, 9, 40, 1000, 7, 0}, {2, 3});
  for (RopeLayout layout : kLayouts) {
    for (const RopeParams& p : {plain_params(layout), linear_params(layout), llama3_params(layout)}) {
      const Tensor x = random_tensor({2, 3, 2, 8}, DType::f64);
      testing::expect_gradients_match(
          {x}, [&](const std::vector<Tensor>& in) { return rope(in[0], positions, p); },
          [&](const std::vector<Tensor>&, const Tensor& g) {
            return std::vector<Tensor>{rope_backward(g, positions, p)};
          });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, RopeTest, ::testing::ValuesIn(testing::test_devices()), testing::device_test_name);

}  // namespace
}  // namespace microllm
