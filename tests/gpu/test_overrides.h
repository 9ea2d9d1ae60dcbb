#pragma once
// What a re-run of a GPU suite forces through the planners' overrides (never the environment): set from the command
// line by overrides_main.cpp (ctest passes it, tests/gpu/CMakeLists.txt). --no-hopper: the mma.sync kernel wherever
// the Hopper kernels would run, forward and backward (sm_90's fallback stays tested on the H100); --combine: split decodes merge in the
// combine kernel, not in a cluster (the pre-sm_90 path and the one for too many splits); --few-ctas: the persistent
// Hopper forward launches 3 CTAs, so each walks many work tiles (its tile loop, the ring and Q phases across tiles,
// whatever the grid of a test's shape). The wrappers below are the
// suites' calls of forward / decode under these overrides (suite_*: distinct names, no overload of the library's).
#include <string>

#include "flashlite/attention.h"
#include "flashlite/backward.h"
#include "flashlite/errors.h"
#include "flashlite/kv_cache.h"

namespace fltest {

struct SuiteOverrides {
  bool no_hopper = false;
  bool combine = false;
  bool few_ctas = false;
};

inline SuiteOverrides& suite_overrides() {
  static SuiteOverrides o;
  return o;
}

// The forward plan of args under the suite's overrides.
inline flashlite::ForwardPlan suite_forward_plan(const flashlite::ForwardArgs& args) {
  flashlite::ForwardPlan plan = flashlite::plan_forward(args, {flashlite::ForwardKernel::automatic,
                                                               suite_overrides().few_ctas ? 3 : 0});
  if (suite_overrides().no_hopper && plan.kernel == flashlite::ForwardKernel::cuda_hopper) {
    plan = flashlite::plan_forward(args, {flashlite::ForwardKernel::cuda_mma});
  }
  return plan;
}

inline void suite_forward(flashlite::ForwardArgs args) {
  const flashlite::ForwardPlan plan = suite_forward_plan(args);
  args.plan = &plan;
  flashlite::forward(args);
}

inline std::string suite_forward_kernel_name(flashlite::ForwardArgs args) {
  const flashlite::ForwardPlan plan = suite_forward_plan(args);
  args.plan = &plan;
  return flashlite::forward_kernel_name(args);
}

// The backward overrides of a call on CUDA tensors under the suite's: the planner's choice (the Hopper kernels on
// sm_90 wherever they accept the call), the mma.sync kernels under --no-hopper.
inline flashlite::BackwardOverrides cuda_backward_overrides() {
  if (suite_overrides().no_hopper) return {flashlite::BackwardKernel::cuda_mma};
  return {};
}

// Decode overrides of a call with `splits` forced (0: planned) under the suite's merge.
inline flashlite::DecodeOverrides decode_overrides(int splits = 0) {
  return {splits, suite_overrides().combine ? flashlite::DecodeMerge::combine : flashlite::DecodeMerge::automatic};
}

inline flashlite::DecodePlan suite_plan_decode(const flashlite::DecodeArgs& args, int64_t max_kv_len = -1, int splits = 0) {
  return flashlite::plan_decode(args, max_kv_len, decode_overrides(splits));
}

// decode() / decode_kernel_name(): under args.plan when the test made one, else under a plan of the suite's overrides.
inline void suite_decode(flashlite::DecodeArgs args) {
  flashlite::DecodePlan plan;
  if (args.plan == nullptr) {
    plan = suite_plan_decode(args);
    args.plan = &plan;
  }
  flashlite::decode(args);
}

inline std::string suite_decode_kernel_name(flashlite::DecodeArgs args) {
  flashlite::DecodePlan plan;
  if (args.plan == nullptr) {
    plan = suite_plan_decode(args);
    args.plan = &plan;
  }
  return flashlite::decode_kernel_name(args);
}

}  // namespace fltest
