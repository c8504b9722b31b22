// Tensor: copies and dtype conversions for every pair, factories, the seeded RNG and printing (the views and
// their argument errors: tensor_views_test.cpp).
#include "microllm/core/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "microllm/core/threads.h"
#include "test_support.h"

namespace microllm {
namespace {

// ---------------------------------------------------------------------------------------------------
// Helpers

template <typename T>
constexpr bool is_narrow_v =
    std::is_same_v<T, f16> || std::is_same_v<T, bf16> || std::is_same_v<T, f8_e4m3fn> || std::is_same_v<T, f8_e5m2>;

// fn.template operator()<T>() with T the storage type of `dtype`.
template <typename Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
#define MICROLLM_TEST_CASE(name, type, str) \
  case DType::name: fn.template operator()<type>(); return;
    MICROLLM_DTYPES(MICROLLM_TEST_CASE)
#undef MICROLLM_TEST_CASE
  }
}

template <typename T>
double exact_value(T v) {
  if constexpr (is_narrow_v<T>)
    return to_float(v);
  else
    return static_cast<double>(v);
}

// The stored values of a tensor, read directly from its elements (not through the library's conversions).
std::vector<double> raw_values(const Tensor& t) {
  std::vector<double> out;
  const Tensor c = t.contiguous();
  with_type(t.dtype(), [&]<typename T>() {
    const T* p = c.data<T>();
    for (int64_t i = 0; i < c.numel(); ++i) out.push_back(exact_value(p[i]));
  });
  return out;
}

const DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,       DType::i8,
                            DType::u8,  DType::i32, DType::i64,  DType::f8_e4m3fn, DType::f8_e5m2};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------------------------------
// Copies and conversions

// The element conversion rules, written out: floats round to nearest even (through f32 for the narrow
// formats); float -> integer truncates toward zero, saturates, NaN -> 0; integer -> integer wraps.
template <typename Dst>
Dst expected_conversion(double v, bool source_is_float) {
  if constexpr (is_narrow_v<Dst>) {
    return from_float<Dst>(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<Dst>) {
    return static_cast<Dst>(v);
  } else if (!source_is_float) {
    return static_cast<Dst>(static_cast<int64_t>(v));
  } else {
    if (std::isnan(v)) return 0;
    const double t = std::trunc(v);
    if (t <= static_cast<double>(std::numeric_limits<Dst>::lowest())) return std::numeric_limits<Dst>::lowest();
    if (t >= static_cast<double>(std::numeric_limits<Dst>::max())) return std::numeric_limits<Dst>::max();
    return static_cast<Dst>(t);
  }
}

template <typename T>
bool same_element(T a, T b) {
  if constexpr (is_narrow_v<T>) {
    return a.bits == b.bits || (std::isnan(to_float(a)) && std::isnan(to_float(b)));
  } else if constexpr (std::is_floating_point_v<T>) {
    return (a == b && std::signbit(a) == std::signbit(b)) || (std::isnan(a) && std::isnan(b));
  } else {
    return a == b;
  }
}

// Source values of a dtype, each exactly representable in it.
template <typename T>
std::vector<T> source_values() {
  std::vector<T> out;
  if constexpr (is_narrow_v<T> || std::is_floating_point_v<T>) {
    for (double v : {0.0,
                     -0.0,
                     0.5,
                     -0.5,
                     1.0,
                     -1.0,
                     2.5,
                     -2.5,
                     2.75,
                     -2.75,
                     7.9,
                     -7.9,
                     100.5,
                     -100.5,
                     127.0,
                     128.0,
                     -129.0,
                     255.5,
                     256.0,
                     300.0,
                     -300.0,
                     448.0,
                     1000.25,
                     65504.0,
                     70000.0,
                     -70000.0,
                     3e9,
                     -3e9,
                     1e19,
                     -1e19,
                     1e30,
                     -1e30,
                     1e-30,
                     static_cast<double>(NAN),
                     static_cast<double>(INFINITY),
                     -static_cast<double>(INFINITY)}) {
      if constexpr (is_narrow_v<T>)
        out.push_back(from_float<T>(static_cast<float>(v)));
      else
        out.push_back(static_cast<T>(v));
    }
  } else {
    for (int64_t v : {int64_t{0},
                      int64_t{1},
                      int64_t{-1},
                      int64_t{5},
                      int64_t{-7},
                      int64_t{100},
                      int64_t{127},
                      int64_t{-128},
                      int64_t{200},
                      int64_t{255},
                      int64_t{256},
                      int64_t{300},
                      int64_t{-300},
                      int64_t{40000},
                      int64_t{-40000},
                      int64_t{2147483647},
                      int64_t{-2147483647} - 1,
                      (int64_t{1} << 40) + 3,
                      -(int64_t{1} << 40) - 3,
                      (int64_t{1} << 53) - 1}) {
      if (v >= static_cast<int64_t>(std::numeric_limits<T>::lowest()) &&
          v <= static_cast<int64_t>(std::numeric_limits<T>::max())) {
        out.push_back(static_cast<T>(v));
      }
    }
  }
  return out;
}

TEST(TensorCopy, ToConvertsEveryDtypePairByTheElementRules) {
  for (DType src_dtype : kAllDTypes) {
    with_type(src_dtype, [&]<typename S>() {
      const std::vector<S> values = source_values<S>();
      const auto n = static_cast<int64_t>(values.size());
      // Also a non-contiguous source: the values twice, read through a transpose.
      std::vector<S> doubled = values;
      doubled.insert(doubled.end(), values.begin(), values.end());
      const Tensor src = Tensor::from_vector(values, {n});
      const Tensor strided = Tensor::from_vector(doubled, {2, n}).t();
      const bool source_is_float = is_floating(src_dtype);
      for (DType dst_dtype : kAllDTypes) {
        with_type(dst_dtype, [&]<typename D>() {
          for (const Tensor& input : {src, strided}) {
            const Tensor out = input.to(dst_dtype);
            ASSERT_EQ(out.dtype(), dst_dtype);
            ASSERT_EQ(out.shape(), input.shape());
            if (src_dtype == dst_dtype) {
              EXPECT_TRUE(out.shares_storage_with(input));
            }
            const Tensor packed = out.contiguous();
            const D* got = packed.data<D>();
            for (int64_t i = 0; i < out.numel(); ++i) {
              const S s = values[static_cast<size_t>(input.dim() == 1 ? i : i / 2)];
              const D want = expected_conversion<D>(exact_value(s), source_is_float);
              ASSERT_TRUE(same_element(got[i], want))
                  << src_dtype << " -> " << dst_dtype << ": " << exact_value(s) << " became " << exact_value(got[i])
                  << ", expected " << exact_value(want);
            }
          }
        });
      }
    });
  }
}

TEST(TensorCopy, ConversionSpotChecks) {
  const Tensor f = Tensor::from_vector<float>({2.9f, -2.9f, NAN, 1e20f, -1e20f, 300.0f, -0.5f}, {7});
  EXPECT_EQ(f.to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{2, -2, 0, 2147483647, -2147483647 - 1, 300, 0}));
  EXPECT_EQ(f.to(DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{2, 0, 0, 255, 0, 255, 0}));
  EXPECT_EQ(f.to(DType::i8).to_vector<int8_t>(), (std::vector<int8_t>{2, -2, 0, 127, -128, 127, 0}));
  const Tensor i = Tensor::from_vector<int64_t>({300, -1, 256 + 7}, {3});
  EXPECT_EQ(i.to(DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{44, 255, 7}));
  EXPECT_EQ(i.to(DType::i8).to_vector<int8_t>(), (std::vector<int8_t>{44, -1, 7}));
  EXPECT_EQ(Tensor::from_vector<float>({500.0f}, {1}).to(DType::f8_e4m3fn).to_vector<float>()[0] !=
                Tensor::from_vector<float>({500.0f}, {1}).to(DType::f8_e4m3fn).to_vector<float>()[0],
            true);  // NaN
  EXPECT_EQ(Tensor::from_vector<float>({1e6f}, {1}).to(DType::f16).item<float>(), INFINITY);
}

TEST(TensorCopy, CopyBroadcastsAndConverts) {
  Tensor dst = Tensor::zeros({3, 4}, DType::f32);
  dst.copy_(Tensor::from_vector<double>({1, 2, 3, 4}, {4}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  dst.copy_(Tensor::from_vector<int32_t>({7, 8, 9}, {3, 1}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{7, 7, 7, 7, 8, 8, 8, 8, 9, 9, 9, 9}));
  dst.copy_(Tensor::scalar(-1.5, DType::f16));
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(12, -1.5f));
  EXPECT_THROW(dst.copy_(Tensor::zeros({2, 4})), ShapeError);
  EXPECT_THROW(dst.copy_(Tensor::zeros({1, 3, 4})), ShapeError);
  EXPECT_THROW(dst.copy_(Tensor()), ValueError);
  EXPECT_THROW(Tensor().copy_(dst), ValueError);
  // Into a strided view: only the view's elements change.
  Tensor base = Tensor::full({4, 6}, -1, DType::i64);
  Tensor columns = base.slice(1, 0, 6, 2);  // [4, 3]
  columns.copy_(Tensor::arange(12, DType::f32).view({3, 4}).t());
  const std::vector<int64_t> got = base.to_vector<int64_t>();
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 6; ++c) {
      const int64_t want = c % 2 == 0 ? (c / 2) * 4 + r : -1;
      EXPECT_EQ(got[static_cast<size_t>(r * 6 + c)], want) << r << "," << c;
    }
  }
  // Empty copies are fine.
  Tensor empty = Tensor::zeros({0, 3});
  EXPECT_NO_THROW(empty.copy_(Tensor::ones({3})));
}

TEST(TensorCopy, FromVectorFromBlobItemToVector) {
  const Tensor v = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(v.dtype(), DType::i32);
  EXPECT_EQ(v.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(v.storage()->owns_memory());  // a copy, not the caller's vector
  const std::string message = testing::thrown_message<ShapeError>([] {
    Tensor::from_vector<float>({1, 2, 3}, {2, 2});
  });
  EXPECT_TRUE(contains(message, "[from_vector]")) << message;
  // from_blob borrows: writes on either side show on the other; keep_alive lives as long as the storage.
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = buffer;
  {
    Tensor blob = Tensor::from_blob(buffer->data(), {2, 3}, DType::f32, Device::cpu(), buffer);
    EXPECT_FALSE(blob.storage()->owns_memory());
    (*buffer)[4] = 42;
    EXPECT_EQ(blob.to_vector<float>()[4], 42.0f);
    blob.data<float>()[0] = -1;
    EXPECT_EQ((*buffer)[0], -1.0f);
    Tensor view = blob.t();
    buffer.reset();
    blob = Tensor();
    EXPECT_FALSE(watch.expired());  // the view keeps the storage, and the storage keeps the buffer
    EXPECT_EQ(view.to_vector<float>()[1], 4.0f);
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_THROW(Tensor::from_blob(nullptr, {2}, DType::f32), ValueError);
  EXPECT_NO_THROW(Tensor::from_blob(nullptr, {0}, DType::f32));
  // item
  EXPECT_EQ(Tensor::scalar(2.5).item<float>(), 2.5f);
  EXPECT_EQ(Tensor::full({1, 1}, 7, DType::i64).item<int64_t>(), 7);
  EXPECT_EQ(Tensor::scalar(2.7).item<int64_t>(), 2);  // converted by the element rules
  const std::string item_message = testing::thrown_message<ShapeError>([&] { (void)v.item<int32_t>(); });
  EXPECT_TRUE(contains(item_message, "[item]")) << item_message;
  EXPECT_TRUE(contains(item_message, "[2, 3]")) << item_message;
  EXPECT_THROW((void)Tensor::zeros({0}).item<float>(), ShapeError);
  // to() on the same dtype or device returns the tensor itself.
  EXPECT_TRUE(v.to(DType::i32).shares_storage_with(v));
  EXPECT_TRUE(v.to(Device::cpu()).shares_storage_with(v));
  EXPECT_FALSE(v.to(DType::i64).shares_storage_with(v));
}

// ---------------------------------------------------------------------------------------------------
// Factories

TEST(TensorFactories, ZerosOnesFullScalarEmpty) {
  for (DType dtype : kAllDTypes) {
    EXPECT_EQ(raw_values(Tensor::zeros({2, 3}, dtype)), std::vector<double>(6, 0.0)) << dtype;
    EXPECT_EQ(raw_values(Tensor::ones({4}, dtype)), std::vector<double>(4, 1.0)) << dtype;
    const Tensor e = Tensor::empty({3, 5}, dtype);
    EXPECT_EQ(e.shape(), (Shape{3, 5}));
    EXPECT_EQ(e.strides(), (Strides{5, 1}));
    EXPECT_EQ(e.dtype(), dtype);
  }
  EXPECT_EQ(raw_values(Tensor::full({2}, 2.5, DType::f16)), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(raw_values(Tensor::full({2}, 2.9, DType::i32)), (std::vector<double>{2, 2}));
  EXPECT_EQ(raw_values(Tensor::full({2}, -2.9, DType::i64)), (std::vector<double>{-2, -2}));
  EXPECT_EQ(raw_values(Tensor::full({1}, 300, DType::i8)), (std::vector<double>{127}));
  EXPECT_EQ(raw_values(Tensor::full({1}, -1, DType::u8)), (std::vector<double>{0}));
  EXPECT_EQ(raw_values(Tensor::full({1}, NAN, DType::i32)), (std::vector<double>{0}));
  EXPECT_EQ(raw_values(Tensor::full({1}, 1e6, DType::f16)), (std::vector<double>{INFINITY}));
  EXPECT_TRUE(std::isnan(raw_values(Tensor::full({1}, 500, DType::f8_e4m3fn))[0]));
  EXPECT_EQ(raw_values(Tensor::full({1}, 0.1, DType::bf16))[0], to_float(bf16_from_float(0.1f)));
  const Tensor s = Tensor::scalar(3.5, DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item<double>(), 3.5);
  EXPECT_EQ(Tensor::zeros({0, 4}).numel(), 0);
}

TEST(TensorFactories, Arange) {
  EXPECT_EQ(Tensor::arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(5).dtype(), DType::i64);
  EXPECT_EQ(Tensor::arange(0).numel(), 0);
  EXPECT_EQ(Tensor::arange(2, 7, 2).to_vector<int64_t>(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(Tensor::arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(Tensor::arange(5, 5).numel(), 0);
  EXPECT_EQ(Tensor::arange(5, 0).numel(), 0);  // wrong direction: empty
  EXPECT_EQ(Tensor::arange(1, 2.5, 0.5, DType::f32).to_vector<float>(), (std::vector<float>{1, 1.5, 2}));
  EXPECT_EQ(Tensor::arange(0, 1, 0.25, DType::f64).to_vector<double>(), (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(Tensor::arange(0, 1, 0.1, DType::f64).numel(), 10);
  EXPECT_EQ(Tensor::arange(0, 0.3, 0.1, DType::f64).numel(), 3);
  const std::vector<double> tenths = Tensor::arange(0, 1, 0.1, DType::f64).to_vector<double>();
  for (size_t i = 0; i < tenths.size(); ++i) EXPECT_DOUBLE_EQ(tenths[i], 0.1 * static_cast<double>(i));
  EXPECT_EQ(Tensor::arange(-1, 1, 0.5, DType::f16).to_vector<float>(), (std::vector<float>{-1, -0.5, 0, 0.5}));
  EXPECT_EQ(Tensor::arange(0, 3, 0.75, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_THROW(Tensor::arange(0, 1, 0), ValueError);
  EXPECT_THROW(Tensor::arange(0, INFINITY, 1), ValueError);
  EXPECT_THROW(Tensor::arange(0, 1, NAN), ValueError);
  EXPECT_TRUE(contains(testing::thrown_message<ValueError>([] { Tensor::arange(0, 1, 0); }), "[arange]"));
}

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(TensorFactories, RandnIsNormal) {
  Generator gen(testing::fresh_seed());
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor x = Tensor::randn({200, 201}, gen, dtype);
    ASSERT_EQ(x.dtype(), dtype);
    const std::vector<double> v = raw_values(x);
    for (double e : v) ASSERT_TRUE(std::isfinite(e));
    EXPECT_NEAR(mean_of(v), 0.0, 0.02) << dtype;
    EXPECT_NEAR(std_of(v), 1.0, 0.02) << dtype;
    // About 4.55% of a normal lies beyond two standard deviations.
    const auto beyond = std::count_if(v.begin(), v.end(), [](double e) { return std::fabs(e) > 2; });
    EXPECT_NEAR(static_cast<double>(beyond) / static_cast<double>(v.size()), 0.0455, 0.005) << dtype;
  }
  const std::vector<double> shifted = raw_values(Tensor::randn({40001}, gen, DType::f32, Device::cpu(), 3, 0.5));
  EXPECT_NEAR(mean_of(shifted), 3.0, 0.02);
  EXPECT_NEAR(std_of(shifted), 0.5, 0.02);
  EXPECT_THROW(Tensor::randn({3}, gen, DType::i32), DTypeError);
  EXPECT_EQ(Tensor::randn({0}, gen).numel(), 0);
}

TEST(TensorFactories, UniformStaysInItsHalfOpenRange) {
  Generator gen(testing::fresh_seed());
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::f8_e4m3fn, DType::f8_e5m2}) {
    for (const auto& [low, high] : {std::pair{-1.0, 1.0}, std::pair{2.0, 5.0}, std::pair{0.0, 1e8}}) {
      if (high > 1e6 && dtype != DType::f32 && dtype != DType::f64) continue;
      const std::vector<double> v = raw_values(Tensor::uniform({1 << 16}, gen, low, high, dtype));
      const double lowest = *std::min_element(v.begin(), v.end());
      const double highest = *std::max_element(v.begin(), v.end());
      EXPECT_GE(lowest, low) << dtype << " [" << low << ", " << high << ")";
      EXPECT_LT(highest, high) << dtype << " [" << low << ", " << high << ")";
      if (dtype == DType::f32 || dtype == DType::f64) {
        EXPECT_NEAR(mean_of(v), (low + high) / 2, (high - low) * 0.01);
        EXPECT_NEAR(std_of(v), (high - low) / std::sqrt(12.0), (high - low) * 0.01);
      }
    }
  }
  EXPECT_THROW(Tensor::uniform({3}, gen, 1, 0), ValueError);
  EXPECT_THROW(Tensor::uniform({3}, gen, 0, 1, DType::i64), DTypeError);
}

TEST(TensorFactories, SeededGeneratorsReproduce) {
  const uint64_t seed = testing::fresh_seed();
  Generator a(seed), b(seed), c(seed + 1);
  const Tensor xa = Tensor::randn({1001}, a);
  const Tensor xb = Tensor::randn({1001}, b);
  const Tensor xc = Tensor::randn({1001}, c);
  EXPECT_EQ(xa.to_vector<float>(), xb.to_vector<float>());
  EXPECT_NE(xa.to_vector<float>(), xc.to_vector<float>());
  EXPECT_EQ(a.offset(), 251u);  // one Philox block per four elements
  // The next draw continues from the offset: different numbers; rewinding the state replays them.
  const Tensor next = Tensor::randn({1001}, a);
  EXPECT_NE(next.to_vector<float>(), xa.to_vector<float>());
  a.set_state(seed, 0);
  EXPECT_EQ(Tensor::randn({1001}, a).to_vector<float>(), xa.to_vector<float>());
  c.set_state(seed, 251);
  EXPECT_EQ(Tensor::uniform({7}, b).to_vector<float>(), Tensor::uniform({7}, c).to_vector<float>());
}

TEST(TensorFactories, RandomValuesDoNotDependOnTheThreadCount) {
  const uint64_t seed = testing::fresh_seed();
  set_num_threads(1);
  Generator one(seed);
  const std::vector<float> serial = Tensor::randn({300001}, one).to_vector<float>();
  const std::vector<float> serial_uniform = Tensor::uniform({300001}, one).to_vector<float>();
  set_num_threads(4);
  Generator four(seed);
  const std::vector<float> parallel = Tensor::randn({300001}, four).to_vector<float>();
  const std::vector<float> parallel_uniform = Tensor::uniform({300001}, four).to_vector<float>();
  set_num_threads(0);
  EXPECT_EQ(serial, parallel);
  EXPECT_EQ(serial_uniform, parallel_uniform);
}

// ---------------------------------------------------------------------------------------------------
// Printing

TEST(TensorPrint, SmallTensorsExactly) {
  EXPECT_EQ(Tensor::arange(6).view({2, 3}).str(),
            "tensor([[0, 1, 2],\n        [3, 4, 5]], shape=[2, 3], dtype=i64, device=cpu)");
  EXPECT_EQ(Tensor::from_vector<float>({0.5f, -1.25f, 3, 123456, 1e-5f}, {5}).str(),
            "tensor([0.5, -1.25, 3, 1.235e+05, 1e-05], shape=[5], dtype=f32, device=cpu)");
  EXPECT_EQ(Tensor::scalar(2.5).str(), "tensor(2.5, shape=[], dtype=f32, device=cpu)");
  EXPECT_EQ(Tensor::arange(8, DType::i32).view({2, 2, 2}).str(),
            "tensor([[[0, 1],\n         [2, 3]],\n        [[4, 5],\n         [6, 7]]], shape=[2, 2, 2], dtype=i32, "
            "device=cpu)");
  EXPECT_EQ(Tensor::from_vector<double>({NAN, -INFINITY}, {2}).str(),
            "tensor([nan, -inf], shape=[2], dtype=f64, device=cpu)");
  EXPECT_EQ(Tensor::zeros({0}).str(), "tensor([], shape=[0], dtype=f32, device=cpu)");
  EXPECT_EQ(Tensor::arange(6).view({2, 3}).t().str(),
            "tensor([[0, 3],\n        [1, 4],\n        [2, 5]], shape=[3, 2], dtype=i64, device=cpu)");
  EXPECT_EQ(Tensor().str(), "Tensor(undefined)");
  std::ostringstream out;
  out << Tensor::ones({2}, DType::bf16);
  EXPECT_EQ(out.str(), "tensor([1, 1], shape=[2], dtype=bf16, device=cpu)");
}

TEST(TensorPrint, LargeTensorsAreTruncated) {
  EXPECT_EQ(Tensor::arange(2000).str(),
            "tensor([0, 1, 2, ..., 1997, 1998, 1999], shape=[2000], dtype=i64, device=cpu)");
  EXPECT_FALSE(contains(Tensor::arange(1000).str(), "..."));  // at most 1000 elements print in full
  const std::string big = Tensor::arange(1600, DType::f32).view({40, 40}).str();
  EXPECT_EQ(big.substr(0, 44), "tensor([[0, 1, 2, ..., 37, 38, 39],\n        ");
  EXPECT_TRUE(contains(big, "[80, 81, 82, ..., 117, 118, 119],\n        ...,\n        [1480, 1481, 1482, ..., 1517"))
      << big;
  EXPECT_TRUE(contains(big, "1597, 1598, 1599]], shape=[40, 40], dtype=f32, device=cpu)")) << big;
  EXPECT_EQ(std::count(big.begin(), big.end(), '\n'), 6);
}

}  // namespace
}  // namespace microllm
