#pragma once
// When the Hopper forward kernel's device tests run: a CUDA device of compute capability 9.0, a build with the 90a
// target, and FLASHLITE_FWD_HOPPER unset or 1 (the user's setting; 0 turns the kernel off, so the tests skip).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/fwd_hopper/hopper_fwd.h"
#include "gpu_util.h"

namespace fltest {

inline bool hopper_env_on() {
  static const bool on = flashlite::cuda_fwd_hopper::parse_fwd_hopper_setting(std::getenv("FLASHLITE_FWD_HOPPER"));
  return on;
}

inline bool is_sm90() {
  if (!has_gpu()) return false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

}  // namespace fltest

#define FL_SKIP_UNLESS_HOPPER()                                                                                 \
  if (!::fltest::has_gpu()) GTEST_SKIP() << "no CUDA device";                                                   \
  if (!::fltest::is_sm90()) GTEST_SKIP() << "the Hopper kernel runs on sm_90 only";                             \
  if (!::flashlite::cuda_fwd_hopper::hopper_fwd_built())                                                        \
    GTEST_SKIP() << "this build has no 90a target (CMAKE_CUDA_ARCHITECTURES)";                                  \
  if (!::fltest::hopper_env_on()) GTEST_SKIP() << "FLASHLITE_FWD_HOPPER=0 turns the Hopper kernel off"
