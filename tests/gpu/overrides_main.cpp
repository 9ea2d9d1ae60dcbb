// main() of the GPU suites: GoogleTest's flags, then the suite's planner overrides (test_overrides.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "test_overrides.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes its own --gtest_* flags out of argv
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-hopper") {
      fltest::suite_overrides().no_hopper = true;
    } else if (arg == "--combine") {
      fltest::suite_overrides().combine = true;
    } else if (arg == "--few-ctas") {
      fltest::suite_overrides().few_ctas = true;
    } else {
      std::fprintf(stderr, "%s: unknown argument %s; expected --no-hopper, --combine or --few-ctas\n", argv[0],
                   arg.c_str());
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
