// Tests that need the real model files in ../shared/models skip when they are absent, except where
// FLASHLITE_REQUIRE_MODELS=1 (CI sets it through scripts/test.sh): there a missing file fails the test, so a run
// without the models can never pass with the engine's model tests silently skipped.
#pragma once

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

namespace reftest {
inline bool models_required() {
  const char* v = std::getenv("FLASHLITE_REQUIRE_MODELS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace reftest

// Ends the current test (or SetUp): a failure when the models are required, else a skip.
#define FLASHLITE_MODEL_ABSENT(message)                                                 \
  if (::reftest::models_required()) GTEST_FAIL() << message << " (FLASHLITE_REQUIRE_MODELS=1)"; \
  else GTEST_SKIP() << message
