// Test entry point: every allocation is poisoned (0xFF bytes), so an output element an op forgets to
// write is NaN (or -1) and fails the comparison.
#include <gtest/gtest.h>

#include "microllm/core/storage.h"

int main(int argc, char** argv) {
  microllm::set_poison_new_allocations(true);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
