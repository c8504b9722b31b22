// The backends' settings from the environment (src/backend/environment.h): MICROLLM_DISABLE's list of paths and
// the helpers every variable is read through; what they accept, and a clear error naming the variable or the
// path for anything else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/environment.h"
#include "microllm/core/error.h"

namespace microllm {
namespace {

constexpr const char* kName = "MICROLLM_TEST_ENVIRONMENT_SETTING";

// Sets kName for one test and unsets it afterwards.
struct ScopedSetting {
  explicit ScopedSetting(const char* value) { setenv(kName, value, 1); }
  ~ScopedSetting() { unsetenv(kName); }
};

std::string count_error(const char* value) {
  const ScopedSetting setting(value);
  try {
    detail::count_from_environment(kName, 1, 8);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "no error";
}

std::string disable_error(const char* value) {
  try {
    detail::parse_disabled_paths(value);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "no error";
}

TEST(BackendEnvironment, DisableParsesAListOfPaths) {
  using detail::FastPath;
  using detail::parse_disabled_paths;
  using detail::path_bit;
  EXPECT_EQ(parse_disabled_paths(""), 0u);
  EXPECT_EQ(parse_disabled_paths(" , "), 0u);
  EXPECT_EQ(parse_disabled_paths("gemv"), path_bit(FastPath::gemv));
  EXPECT_EQ(parse_disabled_paths("gemv,pdl,attention-o"),
            path_bit(FastPath::gemv) | path_bit(FastPath::pdl) | path_bit(FastPath::attention_o));
  EXPECT_EQ(parse_disabled_paths(" attention-head-cluster , gemv,gemv,"),
            path_bit(FastPath::attention_head_cluster) | path_bit(FastPath::gemv));
  // Every path by its own name.
  for (const FastPath path : {FastPath::gemv, FastPath::gemm_tuning, FastPath::swiglu_gemm, FastPath::flash_wgmma,
                              FastPath::fast_attention, FastPath::pdl, FastPath::attention_o,
                              FastPath::attention_cluster, FastPath::attention_head_cluster}) {
    EXPECT_EQ(parse_disabled_paths(detail::path_name(path)), path_bit(path)) << detail::path_name(path);
  }
}

TEST(BackendEnvironment, DisableRefusesAnUnknownPathNamingIt) {
  for (const char* value : {"gemvv", "gemv,attention_o", "GEMV", "pdl,,nothing"}) {
    const std::string message = disable_error(value);
    EXPECT_NE(message.find("MICROLLM_DISABLE"), std::string::npos) << value << ": " << message;
    EXPECT_NE(message.find("unknown path"), std::string::npos) << value << ": " << message;
    EXPECT_NE(message.find("gemv, gemm-tuning, swiglu-gemm"), std::string::npos) << value << ": " << message;
  }
  EXPECT_NE(disable_error("gemv,attention_o").find("\"attention_o\""), std::string::npos);
  EXPECT_NE(disable_error("pdl,,nothing").find("\"nothing\""), std::string::npos);
}

TEST(BackendEnvironment, SwitchIsOnUnlessZero) {
  unsetenv(kName);
  EXPECT_TRUE(detail::switch_from_environment(kName));
  {
    const ScopedSetting on("1");
    EXPECT_TRUE(detail::switch_from_environment(kName));
  }
  {
    const ScopedSetting off("0");
    EXPECT_FALSE(detail::switch_from_environment(kName));
  }
  const ScopedSetting bad("yes");
  EXPECT_THROW(detail::switch_from_environment(kName), ValueError);
}

TEST(BackendEnvironment, CountIsZeroUnsetElseAWholeNumberInRange) {
  unsetenv(kName);
  EXPECT_EQ(detail::count_from_environment(kName, 1, 8), 0);
  for (const char* value : {"1", "4", "8"}) {
    const ScopedSetting setting(value);
    EXPECT_EQ(detail::count_from_environment(kName, 1, 8), std::atoi(value)) << value;
  }
  for (const char* value : {"0", "9", "-3", "abc", "4x", "", "99999999999999999999"}) {
    const std::string message = count_error(value);
    EXPECT_NE(message.find(kName), std::string::npos) << value << ": " << message;
    EXPECT_NE(message.find("[1, 8]"), std::string::npos) << value << ": " << message;
  }
}

}  // namespace
}  // namespace microllm
