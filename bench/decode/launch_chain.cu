// The fixed cost of a decode call that no kernel body can remove (GPU machine): per-node time of a CUDA graph of
// back-to-back kernels shaped like the batch-1 decode grids, with (almost) no work in them.
//
//   flashlite_launch_chain --out launch_chain.json [--nodes 64] [--reps 20]
//
// Each row is a graph of `nodes` launches of one kernel on one stream, replayed `reps` times; per node = median
// replay time / nodes. Kernels: `empty` (returns at once), `pdl` (griddepcontrol.launch_dependents, then
// griddepcontrol.wait: the shape of every flashlite decode / engine kernel) and `dep` (pdl, then block 0 reads one
// word the previous node wrote and writes it + 1: one real dependency per node, an L2 round trip). Launch shapes: the
// decode split grids at batch 1 (128 or 256 blocks of 128 threads; 57 KB or 104 KB of dynamic shared memory) with and
// without programmatic dependent launch, and with 16-block clusters (the cluster merge's grid). The difference between
// these rows and the decode bench's graph column at b1 kv1024 (one key tile per block) is the kernel's own chain
// (loads, the tile, the merge).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

enum class Body { empty, pdl, dep };

template <Body B>
__global__ void chain_kernel(int* word) {
  if constexpr (B != Body::empty) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  }
  if constexpr (B == Body::dep) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<volatile int*>(word) = *reinterpret_cast<volatile int*>(word) + 1;
  }
}

struct Shape {
  std::string name;
  Body body;
  int blocks, smem, cluster;
  bool pdl;
};

double per_node_us(const Shape& s, int nodes, int reps, int* word) {
  void* fn = s.body == Body::empty ? reinterpret_cast<void*>(&chain_kernel<Body::empty>)
             : s.body == Body::pdl ? reinterpret_cast<void*>(&chain_kernel<Body::pdl>)
                                   : reinterpret_cast<void*>(&chain_kernel<Body::dep>);
  ck(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, s.smem), "smem attribute");
  if (s.cluster > 8) ck(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "cluster attribute");
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (s.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (s.cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(s.cluster), attr[n].val.clusterDim.y = 1, attr[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(s.blocks));
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = size_t(s.smem);
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = unsigned(n);
  void* args[] = {&word};
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < nodes; ++i) ck(cudaLaunchKernelExC(&cfg, fn, args), "launch");
  ck(cudaStreamEndCapture(st, &graph), "end capture");
  ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < reps + 3; ++r) {
    cudaEventRecord(e0, st);
    cudaGraphLaunch(exec, st);
    cudaEventRecord(e1, st);
    ck(cudaEventSynchronize(e1), "replay");
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(st);
  return ms[ms.size() / 2] * 1e3 / nodes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "launch_chain.json";
  int nodes = 64, reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--nodes" && i + 1 < argc) nodes = std::max(1, std::atoi(argv[++i]));
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "props");
  int* word;
  ck(cudaMalloc(&word, sizeof(int)), "malloc");
  ck(cudaMemset(word, 0, sizeof(int)), "memset");
  const std::vector<Shape> shapes = {
      {"empty, 128 blocks, no PDL", Body::empty, 128, 57 * 1024, 1, false},
      {"pdl, 128 blocks, 57 KB (b1 D64 cluster grid, no cluster)", Body::pdl, 128, 57 * 1024, 1, true},
      {"pdl, 128 blocks, 57 KB, clusters of 16 (b1 D64 / kv1024 cluster merge)", Body::pdl, 128, 57 * 1024, 16, true},
      {"pdl, 128 blocks, 104 KB, clusters of 16 (b1 D128 kv1024)", Body::pdl, 128, 104 * 1024, 16, true},
      {"pdl, 256 blocks, 104 KB (b1 D128 kv8192: 32 splits)", Body::pdl, 256, 104 * 1024, 1, true},
      {"dep, 256 blocks, 104 KB (one dependent word per node)", Body::dep, 256, 104 * 1024, 1, true},
      {"dep, 128 blocks, 104 KB, clusters of 16", Body::dep, 128, 104 * 1024, 16, true},
      {"dep, 256 blocks, 104 KB, no PDL", Body::dep, 256, 104 * 1024, 1, false},
  };
  FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) ck(cudaErrorUnknown, "open --out");
  std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"nodes\": %d, \"reps\": %d, \"rows\": [\n", prop.name,
               prop.multiProcessorCount, nodes, reps);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const double us = per_node_us(s, nodes, reps, word);
    std::printf("chain  %6.2f us per node  %s\n", us, s.name.c_str());
    std::fprintf(f, "%s  {\"shape\": \"%s\", \"blocks\": %d, \"smem\": %d, \"cluster\": %d, \"pdl\": %s, \"us_per_node\": %.3f}",
                 i ? ",\n" : "", s.name.c_str(), s.blocks, s.smem, s.cluster, s.pdl ? "true" : "false", us);
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
  cudaFree(word);
  return 0;
}
