// DType: the one list gives names, sizes, parsing (also PyTorch and safetensors spellings) and traits.
#include "microllm/core/dtype.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <type_traits>

#include "microllm/core/error.h"

namespace microllm {
namespace {

const DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,       DType::i8,
                            DType::u8,  DType::i32, DType::i64,  DType::f8_e4m3fn, DType::f8_e5m2};

TEST(DType, NamesSizesAndKinds) {
  const struct {
    DType dtype;
    const char* name;
    size_t size;
    bool floating;
  } cases[] = {
      {DType::f32, "f32", 4, true},       {DType::f16, "f16", 2, true},  {DType::bf16, "bf16", 2, true},
      {DType::f64, "f64", 8, true},       {DType::i8, "i8", 1, false},   {DType::u8, "u8", 1, false},
      {DType::i32, "i32", 4, false},      {DType::i64, "i64", 8, false}, {DType::f8_e4m3fn, "f8e4m3fn", 1, true},
      {DType::f8_e5m2, "f8e5m2", 1, true}};
  ASSERT_EQ(std::size(cases), std::size(kAllDTypes));
  for (const auto& c : cases) {
    EXPECT_STREQ(dtype_name(c.dtype), c.name);
    EXPECT_EQ(dtype_size(c.dtype), c.size) << c.name;
    EXPECT_EQ(is_floating(c.dtype), c.floating) << c.name;
    EXPECT_EQ(is_integral(c.dtype), !c.floating) << c.name;
    std::ostringstream out;
    out << c.dtype;
    EXPECT_EQ(out.str(), c.name);
  }
}

TEST(DType, ParseRoundTripsEveryName) {
  for (DType dtype : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype) << dtype_name(dtype);
}

TEST(DType, ParseAcceptsPyTorchAndSafetensorsSpellings) {
  const struct {
    const char* text;
    DType dtype;
  } cases[] = {{"float32", DType::f32},
               {"float", DType::f32},
               {"F32", DType::f32},
               {"float16", DType::f16},
               {"half", DType::f16},
               {"F16", DType::f16},
               {"bfloat16", DType::bf16},
               {"BF16", DType::bf16},
               {"float64", DType::f64},
               {"double", DType::f64},
               {"F64", DType::f64},
               {"int8", DType::i8},
               {"I8", DType::i8},
               {"uint8", DType::u8},
               {"U8", DType::u8},
               {"int32", DType::i32},
               {"I32", DType::i32},
               {"int64", DType::i64},
               {"I64", DType::i64},
               {"float8_e4m3fn", DType::f8_e4m3fn},
               {"F8_E4M3", DType::f8_e4m3fn},
               {"float8_e5m2", DType::f8_e5m2},
               {"F8_E5M2", DType::f8_e5m2}};
  for (const auto& c : cases) EXPECT_EQ(parse_dtype(c.text), c.dtype) << c.text;
}

TEST(DType, ParseRejectsUnknownNamesAndSaysWhich) {
  for (const char* text : {"", "f31", "Float32", "bf", "int", "f32 ", "BOOL", "torch.float32"}) {
    try {
      parse_dtype(text);
      ADD_FAILURE() << "'" << text << "' parsed";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("[dtype]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(DType, TraitsMatchTheList) {
  static_assert(std::is_same_v<DTypeTraits<DType::f32>::Type, float>);
  static_assert(std::is_same_v<DTypeTraits<DType::f64>::Type, double>);
  static_assert(std::is_same_v<DTypeTraits<DType::bf16>::Type, bf16>);
  static_assert(std::is_same_v<DTypeTraits<DType::f16>::Type, f16>);
  static_assert(std::is_same_v<DTypeTraits<DType::i8>::Type, int8_t>);
  static_assert(std::is_same_v<DTypeTraits<DType::u8>::Type, uint8_t>);
  static_assert(std::is_same_v<DTypeTraits<DType::i32>::Type, int32_t>);
  static_assert(std::is_same_v<DTypeTraits<DType::i64>::Type, int64_t>);
  static_assert(std::is_same_v<DTypeTraits<DType::f8_e4m3fn>::Type, f8_e4m3fn>);
  static_assert(std::is_same_v<DTypeTraits<DType::f8_e5m2>::Type, f8_e5m2>);
  static_assert(dtype_of<float>() == DType::f32);
  static_assert(dtype_of<f16>() == DType::f16);
  static_assert(dtype_of<int64_t>() == DType::i64);
  static_assert(dtype_of<f8_e5m2>() == DType::f8_e5m2);
  static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && sizeof(f8_e4m3fn) == 1 && sizeof(f8_e5m2) == 1);
  SUCCEED();
}

}  // namespace
}  // namespace microllm
