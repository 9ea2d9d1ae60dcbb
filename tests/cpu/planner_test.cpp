// The forward planner on CPU tensors (plan_forward, include/flashlite/attention.h): every CPU kernel is reachable
// through the overrides and runs right, "unsupported" comes with its reason (and forward() throws it), and a forced
// kernel that contradicts the arguments is a clear error. The CUDA kernels' part: tests/gpu/planner_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace fltest {
namespace {

using flashlite::ForwardKernel;
using flashlite::ForwardPlan;

Spec small_spec() {
  Spec s;
  s.batch = 2, s.seq_q = 9, s.seq_k = 13, s.hq = 4, s.hkv = 2, s.d = 32;
  s.mask.causal = true;
  return s;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << parts.front() << "'";
  } catch (const flashlite::Error& e) {
    EXPECT_EQ(e.kind(), flashlite::ErrorKind::invalid_value) << e.what();
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ForwardPlanner, DefaultIsTheTiledKernel) {
  Problem p(small_spec(), 1);
  const ForwardPlan plan = flashlite::plan_forward(p.args);
  ASSERT_TRUE(plan.supported()) << plan.unsupported;
  EXPECT_EQ(plan.kernel, ForwardKernel::cpu_tiled);
  EXPECT_EQ(plan.name, flashlite::forward_kernel_name(p.args));
  EXPECT_EQ(plan.name.rfind("cpu_tiled_", 0), 0u) << plan.name;
  EXPECT_EQ(plan.workspace_bytes, 0u);
}

// Every CPU kernel of the enum, forced, runs under its plan (forward() follows args.plan) and matches float64.
TEST(ForwardPlanner, EveryCpuKernelIsReachable) {
  const std::vector<std::pair<ForwardKernel, std::string>> kernels = {
      {ForwardKernel::cpu_tiled, "cpu_tiled_"}, {ForwardKernel::cpu_naive, "cpu_naive_three_step"},
      {ForwardKernel::reference, "reference_f64"}};
  for (const auto& [kernel, name] : kernels) {
    SCOPED_TRACE(flashlite::forward_kernel_kind(kernel));
    Problem p(small_spec(), 2);
    const ForwardPlan plan = flashlite::plan_forward(p.args, {kernel});
    ASSERT_TRUE(plan.supported()) << plan.unsupported;
    EXPECT_EQ(plan.kernel, kernel);
    EXPECT_EQ(plan.name.rfind(name, 0), 0u) << plan.name;
    p.args.plan = &plan;
    EXPECT_EQ(flashlite::forward_kernel_name(p.args), plan.name);
    const Result64 ref = reference64(p);
    const Snapshot before = snapshot(p);
    flashlite::forward(p.args);
    expect_matches(p, ref, before, Tolerance{});
  }
}

TEST(ForwardPlanner, UnsupportedComesWithItsReason) {
  Spec s = small_spec();
  s.d = 600;  // over the CPU kernels' limit of 512
  Problem p(s, 3);
  const ForwardPlan plan = flashlite::plan_forward(p.args);
  EXPECT_FALSE(plan.supported());
  EXPECT_EQ(plan.kernel, ForwardKernel::automatic);
  EXPECT_NE(plan.unsupported.find("head_dim 600"), std::string::npos) << plan.unsupported;
  expect_error([&] { flashlite::forward(p.args); }, {"head_dim 600", "at most 512"});
  expect_error([&] { (void)flashlite::forward_kernel_name(p.args); }, {"head_dim 600"});
}

TEST(ForwardPlanner, ForcedKernelThatContradictsTheArgumentsIsAnError) {
  Problem p(small_spec(), 4);
  for (ForwardKernel k : {ForwardKernel::cuda_naive, ForwardKernel::cuda_simt, ForwardKernel::cuda_mma,
                          ForwardKernel::cuda_hopper}) {
    expect_error([&] { (void)flashlite::plan_forward(p.args, {k}); },
                 {std::string("the forced kernel ") + flashlite::forward_kernel_kind(k), "needs CUDA tensors"});
  }
  p.args.backend = Backend::cpu;
  expect_error([&] { (void)flashlite::plan_forward(p.args, {ForwardKernel::cpu_naive}); },
               {"the forced kernel cpu_naive", "backend 'cpu'"});
}

TEST(ForwardPlanner, PersistentCtasOverride) {
  Problem p(small_spec(), 5);
  expect_error([&] { (void)flashlite::plan_forward(p.args, {ForwardKernel::automatic, -1}); },
               {"ForwardOverrides::persistent_ctas is -1", "positive CTA count"});
  // A kernel without a persistent grid ignores it; a plan made under it runs and keeps it.
  const ForwardPlan plan = flashlite::plan_forward(p.args, {ForwardKernel::automatic, 3});
  ASSERT_TRUE(plan.supported()) << plan.unsupported;
  EXPECT_EQ(plan.overrides.persistent_ctas, 3);
  const Result64 ref = reference64(p);
  const Snapshot before = snapshot(p);
  p.args.plan = &plan;
  flashlite::forward(p.args);
  expect_matches(p, ref, before, Tolerance{});
}

}  // namespace
}  // namespace fltest
