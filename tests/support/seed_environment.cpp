// Prints the run's seed before any test, so every randomised test's seed is in its log (ctest
// runs one test per process) and M3SA_TEST_SEED=<seed> reproduces it.
#include <gtest/gtest.h>

#include <cstdio>

#include "testing/host_tensor.h"

namespace m3sa::testing {
namespace {

class SeedEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    std::printf("[ seed ] M3SA_TEST_SEED=%llu\n", static_cast<unsigned long long>(test_seed()));
  }
};

const auto* const kSeedEnvironment = ::testing::AddGlobalTestEnvironment(new SeedEnvironment);

} // namespace
} // namespace m3sa::testing
