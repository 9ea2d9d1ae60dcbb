// The forward planner on CUDA tensors (plan_forward, include/flashlite/attention.h; skipped without a GPU): every CUDA
// kernel of the enum is reachable through the overrides where the device has it (cuda_hopper: sm_90 in a build with the
// 90a target) and matches float64 under its plan; "unsupported" comes with its reason; a forced kernel that cannot run
// the arguments is an answer of the planner and an error of forward() that names it. (The CPU kernels:
// tests/cpu/planner_test.cpp; decode's overrides: tests/kv/decode_gpu_test.cpp and kv_cpu_test.cpp.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/fwd_hopper/hopper_fwd.h"
#include "gpu_util.h"

namespace fltest {
namespace {

using flashlite::ForwardKernel;
using flashlite::ForwardPlan;

Spec spec(DType t, int64_t d) {
  Spec s;
  s.dtype = t;
  s.d = d;
  s.batch = 2, s.seq_q = 200, s.seq_k = 300, s.hq = 8, s.hkv = 2;
  s.mask.causal = true;
  return s;
}

bool hopper_here() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0 && flashlite::cuda_fwd_hopper::hopper_fwd_built();
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << part << "'";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(CudaForwardPlanner, EveryCudaKernelIsReachable) {
  FL_SKIP_WITHOUT_GPU();
  struct K {
    ForwardKernel kernel;
    DType dtype;
    std::string prefix;
  };
  for (const K& k : std::vector<K>{{ForwardKernel::cuda_naive, DType::bf16, "cuda_naive_split"},
                                   {ForwardKernel::cuda_simt, DType::f32, "cuda_fused_simt_f32_d128"},
                                   {ForwardKernel::cuda_mma, DType::bf16, "cuda_fused_mma_bf16_d128_"},
                                   {ForwardKernel::cuda_mma, DType::f16, "cuda_fused_mma_f16_d128_"},
                                   {ForwardKernel::cuda_hopper, DType::bf16, "cuda_hopper_wgmma_bf16_d128"},
                                   {ForwardKernel::cuda_hopper, DType::f16, "cuda_hopper_wgmma_f16_d128"}}) {
    SCOPED_TRACE(k.prefix);
    Problem p(spec(k.dtype, 128), seed_of("planner " + k.prefix));
    const Result64 ref = reference64(p);
    const Snapshot before = snapshot(p);
    DeviceMirror m(p);
    m.args.backend = Backend::automatic;  // the mirror asks for 'cuda'; cuda_naive belongs to 'naive'
    const ForwardPlan plan = flashlite::plan_forward(m.args, {k.kernel});
    if (k.kernel == ForwardKernel::cuda_hopper && !hopper_here()) {
      EXPECT_FALSE(plan.supported());
      EXPECT_NE(plan.unsupported.find("the forced kernel cuda_hopper cannot run"), std::string::npos) << plan.unsupported;
      continue;
    }
    ASSERT_TRUE(plan.supported()) << plan.unsupported;
    EXPECT_EQ(plan.kernel, k.kernel);
    EXPECT_EQ(plan.name.rfind(k.prefix, 0), 0u) << plan.name;
    // Scratch: the naive kernels' scores, the Hopper kernel's tile counter (the spec is causal); none for the others.
    EXPECT_EQ(plan.workspace_bytes > 0, k.kernel == ForwardKernel::cuda_naive || k.kernel == ForwardKernel::cuda_hopper);
    m.args.plan = &plan;
    EXPECT_EQ(flashlite::forward_kernel_name(m.args), plan.name);
    flashlite::forward(m.args);
    m.copy_back();
    expect_matches(p, ref, before, gpu_tolerance(k.dtype));
  }
}

// The default: the Hopper kernel where it runs (FLASHLITE_FWD_HOPPER unset or 1), the mma.sync one elsewhere, SIMT
// for fp32.
TEST(CudaForwardPlanner, DefaultChoice) {
  FL_SKIP_WITHOUT_GPU();
  Problem p(spec(DType::bf16, 128), 1);
  DeviceMirror m(p);
  const ForwardPlan plan = flashlite::plan_forward(m.args);
  const bool setting_on = flashlite::cuda_fwd_hopper::parse_fwd_hopper_setting(std::getenv("FLASHLITE_FWD_HOPPER"));
  EXPECT_EQ(plan.kernel, hopper_here() && setting_on ? ForwardKernel::cuda_hopper : ForwardKernel::cuda_mma) << plan.name;
  Problem p32(spec(DType::f32, 64), 2);
  DeviceMirror m32(p32);
  EXPECT_EQ(flashlite::plan_forward(m32.args).kernel, ForwardKernel::cuda_simt);
  m32.args.backend = Backend::naive;
  EXPECT_EQ(flashlite::plan_forward(m32.args).kernel, ForwardKernel::cuda_naive);
}

TEST(CudaForwardPlanner, UnsupportedComesWithItsReason) {
  FL_SKIP_WITHOUT_GPU();
  Problem p(spec(DType::bf16, 48), 3);  // no fused kernel for head_dim 48
  DeviceMirror m(p);
  const ForwardPlan plan = flashlite::plan_forward(m.args);
  EXPECT_FALSE(plan.supported());
  EXPECT_NE(plan.unsupported.find("head_dim 48"), std::string::npos) << plan.unsupported;
  expect_error([&] { flashlite::forward(m.args); }, "head_dim 48");
  m.args.backend = Backend::naive;  // the split kernels take any head_dim
  EXPECT_TRUE(flashlite::plan_forward(m.args).supported());
}

TEST(CudaForwardPlanner, ForcingAKernelThatCannotRunIsAClearError) {
  FL_SKIP_WITHOUT_GPU();
  struct F {
    ForwardKernel kernel;
    DType dtype;
    int64_t d;
    std::string why;
  };
  for (const F& f : std::vector<F>{{ForwardKernel::cuda_mma, DType::f32, 64, "float16 or bfloat16 only"},
                                   {ForwardKernel::cuda_simt, DType::bf16, 64, "float32 only"},
                                   {ForwardKernel::cuda_hopper, DType::bf16, 96, ""},
                                   {ForwardKernel::cuda_hopper, DType::f32, 64, ""}}) {
    const std::string forced = std::string("the forced kernel ") + flashlite::forward_kernel_kind(f.kernel);
    SCOPED_TRACE(forced);
    Problem p(spec(f.dtype, f.d), 4);
    const Snapshot before = snapshot(p);
    DeviceMirror m(p);
    const ForwardPlan plan = flashlite::plan_forward(m.args, {f.kernel});
    EXPECT_FALSE(plan.supported());
    EXPECT_NE(plan.unsupported.find(forced + " cannot run these arguments"), std::string::npos) << plan.unsupported;
    EXPECT_NE(plan.unsupported.find(f.why), std::string::npos) << plan.unsupported;
    m.args.plan = &plan;
    expect_error([&] { flashlite::forward(m.args); }, forced);
    m.copy_back();
    EXPECT_TRUE(p.outbuf.bytes == before.out) << "out was written";
  }
  // A forced CPU kernel on CUDA tensors, or one of another backend than the requested one, is a bad argument.
  Problem p(spec(DType::bf16, 64), 5);
  DeviceMirror m(p);
  m.args.backend = Backend::automatic;
  expect_error([&] { (void)flashlite::plan_forward(m.args, {ForwardKernel::cpu_tiled}); }, "needs CPU tensors");
  m.args.backend = Backend::cuda;
  expect_error([&] { (void)flashlite::plan_forward(m.args, {ForwardKernel::cuda_naive}); }, "backend 'cuda'");
  m.args.backend = Backend::naive;
  expect_error([&] { (void)flashlite::plan_forward(m.args, {ForwardKernel::cuda_mma}); }, "backend 'naive'");
}

}  // namespace
}  // namespace fltest
