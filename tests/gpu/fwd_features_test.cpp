// The fused CUDA forward kernel beyond the numerics grid: CUDA-graph capture (padded and inline-varlen calls do no
// allocation and no host sync), run-to-run determinism (a race would show), a user stream, the kernel name that
// dispatch reports, and the CUDA-specific bad-input paths (these need no GPU: arguments are rejected first).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_util.h"

namespace fltest {
namespace {

Spec small_spec(DType t, int64_t d) {
  Spec s;
  s.dtype = t;
  s.d = d;
  s.batch = 2;
  s.seq_q = 333;
  s.seq_k = 333;
  s.hq = 4;
  s.hkv = 2;
  s.mask.causal = true;
  return s;
}

std::vector<uint8_t> device_bytes(const void* d, size_t n) {
  std::vector<uint8_t> h(n);
  cuda_check(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

TEST(FusedFeatures, RepeatedRunsAreBitwiseIdentical) {
  FL_SKIP_WITHOUT_GPU();
  for (DType t : {DType::bf16, DType::f32}) {
    Spec s = small_spec(t, 128);
    s.mask = {true, 100, -1, 4};
    Problem p(s, seed_of("determinism"));
    DeviceMirror m(p);
    fltest::suite_forward(m.args);
    FL_CUDA_OK(cudaDeviceSynchronize());
    const auto first = device_bytes(m.device_of(p.outbuf), p.outbuf.bytes.size());
    const auto first_lse = device_bytes(m.device_of(p.lsebuf), p.lsebuf.bytes.size());
    for (int run = 0; run < 5; ++run) {
      m.poison_outputs(p);
      fltest::suite_forward(m.args);
      FL_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(device_bytes(m.device_of(p.outbuf), p.outbuf.bytes.size()) == first) << "run " << run;
      EXPECT_TRUE(device_bytes(m.device_of(p.lsebuf), p.lsebuf.bytes.size()) == first_lse) << "run " << run;
    }
  }
}

// A problem mirrored on the device with its float64 reference, its calls on a user stream.
struct StreamCase {
  Problem p;
  Result64 ref;
  Snapshot before;
  DeviceMirror m;
  cudaStream_t stream = nullptr;
  StreamCase(const Spec& s, const std::string& name)
      : p(s, seed_of(name)), ref(reference64(p)), before(snapshot(p)), m(p) {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    m.args.stream = stream;
  }
  ~StreamCase() { cudaStreamDestroy(stream); }
  // The outputs after the stream's work, against the reference.
  void check(const char* what) {
    cuda_check(cudaStreamSynchronize(stream), what);
    m.copy_back();
    expect_matches(p, ref, before, gpu_tolerance(p.spec.dtype));
  }
};

// Captures forward() in a graph on a user stream, replays it into poisoned outputs and compares with the reference.
void capture_and_check(const Spec& s, const std::string& name) {
  StreamCase c(s, name);
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal), "begin capture");
  fltest::suite_forward(c.m.args);
  cuda_check(cudaStreamEndCapture(c.stream, &graph), "end capture (the call must not sync or allocate)");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int i = 0; i < 2; ++i) cuda_check(cudaGraphLaunch(exec, c.stream), "cudaGraphLaunch");
  c.check("replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Kernel attributes (the shared-memory opt-in above 48 KB) belong to the CUDA context: after cudaDeviceReset the
// forward kernels must set them again instead of failing with "invalid argument". fp16 / bf16 D 128 and D 64 (the
// Hopper kernel on sm_90, the mma kernel before) and fp32 D 128 (the SIMT kernel), each against float64 before and
// after the reset.
TEST(FusedFeatures, KernelsRunAgainAfterCudaDeviceReset) {
  FL_SKIP_WITHOUT_GPU();
  const std::vector<Spec> specs = {small_spec(DType::f16, 128), small_spec(DType::bf16, 64), small_spec(DType::f32, 128)};
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < specs.size(); ++i) {
      SCOPED_TRACE((round ? "after the reset, spec " : "before the reset, spec ") + std::to_string(i));
      run_and_check(specs[i], "reset" + std::to_string(i));
    }
    if (round == 0) cuda_check(cudaDeviceReset(), "cudaDeviceReset");
  }
}

TEST(FusedFeatures, PaddedCallCapturesInCudaGraph) {
  FL_SKIP_WITHOUT_GPU();
  capture_and_check(small_spec(DType::bf16, 64), "graph_padded");
}

TEST(FusedFeatures, InlineVarlenCallCapturesInCudaGraph) {
  FL_SKIP_WITHOUT_GPU();
  Spec s = small_spec(DType::f16, 128);
  s.batch = 1;
  s.varlen_q = {10, 0, 200, 1};
  s.varlen_k = {30, 5, 150, 1};
  capture_and_check(s, "graph_varlen");
}

// More than 128 sequences: the offsets travel through a device table copied from host memory on every call, which a
// graph cannot replay; under capture the call is refused with a clear error, nothing is enqueued (the capture ends
// cleanly and holds no node), and the same call outside the capture is correct.
TEST(FusedFeatures, LongVarlenCallIsRefusedUnderCapture) {
  FL_SKIP_WITHOUT_GPU();
  Spec s = small_spec(DType::bf16, 64);
  s.batch = 1;
  for (int i = 0; i < 130; ++i) {
    s.varlen_q.push_back(i % 7 + 1);
    s.varlen_k.push_back(i % 5 + 2);
  }
  StreamCase c(s, "graph_long_varlen");
  cuda_check(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal), "begin capture");
  try {
    fltest::suite_forward(c.m.args);
    ADD_FAILURE() << "a 130-sequence varlen call was captured";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph cannot capture"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamEndCapture(c.stream, &graph), "end capture (the refused call must not break it)");
  size_t nodes = 1;
  cuda_check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
  EXPECT_EQ(nodes, 0u) << "the refused call enqueued work";
  cudaGraphDestroy(graph);
  fltest::suite_forward(c.m.args);
  c.check("the call outside the capture");
}

TEST(FusedFeatures, KernelNameNamesTheTile) {
  FL_SKIP_WITHOUT_GPU();
  Problem p(small_spec(DType::bf16, 128), 1);
  DeviceMirror m(p);
  const std::string name = fltest::suite_forward_kernel_name(m.args);
  // sm_90 takes the Hopper kernel by default (tests/gpu/hopper_fwd_test.cpp); every other device the mma.sync tile.
  if (name.rfind("cuda_hopper_", 0) == 0) {
    EXPECT_EQ(name.rfind("cuda_hopper_wgmma_bf16_d128", 0), 0u) << name;
  } else {
    EXPECT_EQ(name.rfind("cuda_fused_mma_bf16_d128_", 0), 0u) << name;
  }
  Problem p32(small_spec(DType::f32, 64), 1);
  DeviceMirror m32(p32);
  EXPECT_EQ(fltest::suite_forward_kernel_name(m32.args), "cuda_fused_simt_f32_d64");
}

// Views with fake device pointers: dispatch rejects them before anything touches memory, GPU or not.
ForwardArgs fake_cuda_args(DType t, int64_t d) {
  ForwardArgs a;
  auto view = [&](uintptr_t base, int64_t s, int64_t h) {
    TensorView v = view_n(reinterpret_cast<void*>(base), t, {1, s, h, d}, {s * h * d, h * d, d, 1});
    v.device = Device::cuda(0);
    return v;
  };
  a.q = view(0x100000, 16, 2);
  a.k = view(0x200000, 16, 2);
  a.v = view(0x300000, 16, 2);
  a.out = view(0x400000, 16, 2);
  a.backend = Backend::cuda;
  return a;
}

TEST(FusedFeatures, UnsupportedHeadDimIsRejectedWithItsValue) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t d : {8, 48, 80, 160, 512}) {
      try {
        fltest::suite_forward(fake_cuda_args(t, d));
        ADD_FAILURE() << "head_dim " << d << " was accepted";
      } catch (const flashlite::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("head_dim " + std::to_string(d)), std::string::npos) << msg;
        EXPECT_NE(msg.find("32, 64, 96, 128, 256"), std::string::npos) << msg;
        EXPECT_EQ(e.kind(), flashlite::ErrorKind::invalid_value);
      }
    }
}

TEST(FusedFeatures, CudaBackendRefusesCpuTensors) {
  Spec s = small_spec(DType::f32, 64);
  Problem p(s, 3);
  ForwardArgs a = p.args;
  a.backend = Backend::cuda;
  try {
    fltest::suite_forward(a);
    ADD_FAILURE() << "CPU tensors were accepted by backend 'cuda'";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cuda' needs CUDA tensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fltest
