#include "engine/cuda_ops/step_graphs.h"

#include <exception>

#include "engine/cuda_ops/device_buffer.h"

namespace flashlite::engine::cuda_ops {

namespace {

// The allocation count of the current device's buffers (the graphs are captured and replayed on one device).
uint64_t buffers_generation() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return DeviceBuffer::generation(device);
}

}  // namespace

StepGraphs::~StepGraphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
}

bool StepGraphs::run(const Key& key, cudaStream_t stream, const std::function<void()>& step) {
  if (!on_) {
    step();
    return false;
  }
  Entry& g = graphs_[key];
  if (g.exec && g.generation != buffers_generation()) {  // a buffer moved since the capture
    cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
  }
  if (!g.exec && ++g.seen >= 2) capture(g, stream, step);
  if (!g.exec) {
    step();
    return false;
  }
  const auto launch = [&] { cuda_check(cudaGraphLaunch(g.exec, stream), "decode graph launch"); };
  if (guard_) guard_(launch);
  else launch();
  return true;
}

void StepGraphs::capture(Entry& g, cudaStream_t stream, const std::function<void()>& step) {
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture");
  bool ok = true;
  try {
    step();
  } catch (const std::exception&) {
    ok = false;
  }
  cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (ok && e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (!ok || e != cudaSuccess) {  // eager steps from now on
    cudaGetLastError();
    g.exec = nullptr;
    on_ = false;
    return;
  }
  g.generation = buffers_generation();
}

}  // namespace flashlite::engine::cuda_ops
