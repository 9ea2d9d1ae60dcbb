// The fused forward's workspace (src/cuda/fwd/launch.cu): its layout, unit-tested without a device, and on an sm_90
// device the Hopper kernel's tile counter taken from the caller's workspace. forward_workspace_bytes() counts the
// counter for every causal / window / varlen call the Hopper kernel runs (whatever its tile and CTA counts), and a
// CUDA graph captured with that workspace holds no memory-allocation node: replayed twice into poisoned outputs (the
// counter zeroed by a captured memset each time) it writes bitwise what an uncaptured call writes. Without a GPU, on a
// GPU other than sm_90, or in a build without the 90a target, the device tests skip.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends.h"
#include "common/problem.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/errors.h"
#include "gpu_util.h"
#include "hopper_skip.h"

namespace fltest {
namespace {

using flashlite::AttentionProblem;
using flashlite::ForwardKernel;
using flashlite::FwdPlan;
namespace h = flashlite::cuda_fwd_hopper;

// ---- the layout, without a device: [fold space][to 256 bytes][4-byte tile counter: Hopper, uneven tiles]

AttentionProblem problem(bool causal) {
  AttentionProblem p;
  p.dtype = DType::bf16;
  p.batch = 4, p.seq_q = p.seq_k = 2048, p.q_heads = p.kv_heads = 16, p.head_dim = 128;
  p.mask.causal = causal;
  return p;
}

FwdPlan plan_of(ForwardKernel kernel, size_t fold_bytes) {
  FwdPlan plan;
  plan.kernel = kernel;
  plan.fold_bytes = fold_bytes;
  return plan;
}

TEST(FusedWorkspace, HopperCountsItsTileCounterForUnevenTiles) {
  const AttentionProblem full = problem(false), causal = problem(true);
  // Uniform tiles walk the static schedule: no counter, the fold space only.
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(full, plan_of(ForwardKernel::cuda_hopper, 0)), 0u);
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(full, plan_of(ForwardKernel::cuda_hopper, 1000)), 1000u);
  // Causal: the counter after the fold space, at a 256-byte boundary.
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(causal, plan_of(ForwardKernel::cuda_hopper, 0)), 4u);
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(causal, plan_of(ForwardKernel::cuda_hopper, 1000)), 1024u + 4u);
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(causal, plan_of(ForwardKernel::cuda_hopper, 1024)), 1024u + 4u);
  // Windows either side and varlen batches are uneven too.
  AttentionProblem left = full, right = full, varlen = full;
  left.mask.window_left = 100;
  right.mask.window_right = 0;
  const int32_t cu[] = {0, 5, 9};
  varlen.batch = 2, varlen.cu_seqlens_q = cu, varlen.cu_seqlens_k = cu;
  for (const AttentionProblem* p : {&left, &right, &varlen}) {
    EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(*p, plan_of(ForwardKernel::cuda_hopper, 0)), 4u);
  }
  // Another tile count changes nothing (the size never depends on the CTAs a call launches).
  AttentionProblem one_tile = causal;
  one_tile.batch = 1, one_tile.q_heads = one_tile.kv_heads = 1, one_tile.seq_q = one_tile.seq_k = 17;
  EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(one_tile, plan_of(ForwardKernel::cuda_hopper, 0)), 4u);
  // The mma.sync and SIMT kernels take no counter.
  for (ForwardKernel k : {ForwardKernel::cuda_mma, ForwardKernel::cuda_simt}) {
    EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(causal, plan_of(k, 0)), 0u);
    EXPECT_EQ(flashlite::cuda_fused_workspace_bytes(causal, plan_of(k, 1000)), 1000u);
  }
}

// ---- on the device


struct DevMem {
  void* p = nullptr;
  size_t n = 0;
  explicit DevMem(size_t bytes) : n(bytes) { cuda_check(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc"); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() { cudaFree(p); }
  std::vector<uint8_t> down() const {
    std::vector<uint8_t> host(n);
    cuda_check(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), "D2H");
    return host;
  }
};

// bf16 [batch, seq, heads, 128] q, k, v of random normals on the device, out and lse beside them.
struct DeviceCall {
  int64_t batch, seq, heads, d = 128;
  size_t elems = size_t(batch * seq * heads * d);
  DevMem q{elems * 2}, k{elems * 2}, v{elems * 2}, out{elems * 2}, lse{size_t(batch * heads * seq) * 4};
  ForwardArgs args;

  DeviceCall(int64_t b, int64_t s, int64_t hh, bool causal) : batch(b), seq(s), heads(hh) {
    std::mt19937_64 rng(seed_of("fwd workspace " + std::to_string(b * 1000000 + s * 100 + hh)));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> host(elems);
    for (DevMem* m : {&q, &k, &v}) {
      for (uint16_t& x : host) x = flashlite::float_to_bf16(normal(rng));
      cuda_check(cudaMemcpy(m->p, host.data(), elems * 2, cudaMemcpyHostToDevice), "H2D");
    }
    const std::vector<int64_t> shape{batch, seq, heads, d}, strides{seq * heads * d, heads * d, d, 1};
    args.q = view_n(q.p, DType::bf16, shape, strides);
    args.k = view_n(k.p, DType::bf16, shape, strides);
    args.v = view_n(v.p, DType::bf16, shape, strides);
    args.out = view_n(out.p, DType::bf16, shape, strides);
    args.lse = view_n(lse.p, DType::f32, {batch, heads, seq}, {heads * seq, seq, 1});
    for (TensorView* t : {&args.q, &args.k, &args.v, &args.out, &args.lse}) t->device = Device::cuda(0);
    args.options.causal = causal;
    args.backend = Backend::cuda;
  }
  void poison_outputs(cudaStream_t stream) {  // 0xffff: bf16 NaN; 0xffffffff: fp32 NaN
    cuda_check(cudaMemsetAsync(out.p, 0xff, out.n, stream), "poisoning out");
    cuda_check(cudaMemsetAsync(lse.p, 0xff, lse.n, stream), "poisoning lse");
  }
};

TEST(FusedWorkspace, HopperCausalCallAsksForItsTileCounter) {
  FL_SKIP_UNLESS_HOPPER();
  DeviceCall c(1, 300, 2, true);  // 6 work tiles: fewer than the SMs, still counted
  ASSERT_EQ(flashlite::forward_kernel_name(c.args).rfind("cuda_hopper_", 0), 0u)
      << flashlite::forward_kernel_name(c.args);
  const size_t bytes = flashlite::forward_workspace_bytes(c.args);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(flashlite::plan_forward(c.args).workspace_bytes, bytes);
  EXPECT_EQ(flashlite::plan_forward(c.args, {ForwardKernel::automatic, 3}).workspace_bytes, bytes)
      << "the workspace must not depend on the CTA count";
  c.args.options.causal = false;
  EXPECT_EQ(flashlite::forward_workspace_bytes(c.args), 0u) << "uniform tiles need no counter";
  c.args.options.window_left = 64;
  EXPECT_EQ(flashlite::forward_workspace_bytes(c.args), bytes);
  // A caller's workspace too small for the counter is refused by name, before anything runs.
  c.args.options.window_left = -1;
  c.args.options.causal = true;
  DevMem ws(bytes);
  c.args.workspace = ws.p;
  c.args.workspace_bytes = bytes - 1;
  try {
    flashlite::forward(c.args);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward_workspace_bytes"), std::string::npos) << e.what();
  }
}

// Counts the graph's nodes of one type.
size_t nodes_of_type(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t n = 0;
  cuda_check(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) cuda_check(cudaGraphGetNodes(graph, nodes.data(), &n), "cudaGraphGetNodes");
  size_t count = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    cuda_check(cudaGraphNodeGetType(node, &t), "cudaGraphNodeGetType");
    count += t == type;
  }
  return count;
}

// Causal bf16 D128, batch 4 x 16 heads x 2048 rows: 1024 work tiles, more than any GPU's SMs (and, forced, 3 CTAs),
// so the dynamic schedule runs. Captured with the caller's workspace: no memory node, one memset (the counter); two
// replays into poisoned outputs give bitwise the uncaptured call's out and LSE (a counter not zeroed again would skip
// every tile of the second replay and leave NaN).
TEST(FusedWorkspace, HopperCausalCallCapturesWithTheCallersWorkspace) {
  FL_SKIP_UNLESS_HOPPER();
  for (int ctas : {0, 3}) {
    SCOPED_TRACE("persistent_ctas " + std::to_string(ctas));
    DeviceCall c(4, 2048, 16, true);
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    c.args.stream = stream;
    const flashlite::ForwardPlan plan = flashlite::plan_forward(c.args, {ForwardKernel::automatic, ctas});
    ASSERT_EQ(plan.name.rfind("cuda_hopper_", 0), 0u) << plan.name;
    c.args.plan = &plan;
    const size_t bytes = flashlite::forward_workspace_bytes(c.args);
    ASSERT_GT(bytes, 0u);
    ASSERT_EQ(bytes, plan.workspace_bytes);

    // The uncaptured call without a workspace (the counter allocated stream-ordered): what every run must write.
    c.poison_outputs(stream);
    flashlite::forward(c.args);
    cuda_check(cudaStreamSynchronize(stream), "uncaptured forward");
    const std::vector<uint8_t> want_out = c.out.down(), want_lse = c.lse.down();

    DevMem ws(bytes);
    cuda_check(cudaMemset(ws.p, 0xff, bytes), "poisoning the workspace");  // the launch must zero the counter itself
    c.args.workspace = ws.p;
    c.args.workspace_bytes = bytes;
    cudaGraph_t graph = nullptr;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    try {
      flashlite::forward(c.args);
    } catch (const flashlite::Error& e) {
      (void)cudaStreamEndCapture(stream, &graph);
      FAIL() << "forward under capture: " << e.what();
    }
    cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
    EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemAlloc), 0u) << "the capture allocated memory";
    EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemFree), 0u) << "the capture freed memory";
    EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemset), 1u) << "the tile counter's zeroing";
    EXPECT_GE(nodes_of_type(graph, cudaGraphNodeTypeKernel), 1u);
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      c.poison_outputs(stream);
      cuda_check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      cuda_check(cudaStreamSynchronize(stream), "replay");
      EXPECT_TRUE(c.out.down() == want_out) << "out differs from the uncaptured call";
      EXPECT_TRUE(c.lse.down() == want_lse) << "lse differs from the uncaptured call";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace fltest
