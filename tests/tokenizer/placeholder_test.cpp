#include <gtest/gtest.h>
TEST(TokenizerPlaceholder, Builds) {}
