// The backends' A/B switches from the environment (src/backend/environment.h): what they accept, and a clear
// error naming the variable for anything else.
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
