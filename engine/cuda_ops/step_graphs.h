#pragma once
// Decode steps (and row steps, llama_cuda.cpp) replayed from CUDA graphs, one graph per (rows, logit rows, selection
// kind, k): captured the second time a key is seen (the first step runs eagerly, so lazy module loading and cuBLASLt
// heuristics stay out of the capture), captured again once a DeviceBuffer moved (the graph holds raw pointers). A
// capture that fails turns the graphs off for good: every later step runs eagerly.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

namespace flashlite::engine::cuda_ops {

class StepGraphs {
 public:
  using Key = std::tuple<int, int, int, int>;  // (rows, logit rows, selection kind, k)
  explicit StepGraphs(bool on) : on_(on) {}
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Queues `step` on `stream`: the key's graph when there is one (captured from `step` when due), else `step` itself.
  // True when a graph was launched.
  bool run(const Key& key, cudaStream_t stream, const std::function<void()>& step);
  // Wraps every graph launch (tensor parallelism: Collective::guarded, so no graph replays over an aborted group).
  using Guard = std::function<void(const std::function<void()>&)>;
  void set_launch_guard(Guard guard) { guard_ = std::move(guard); }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;  // DeviceBuffer::generation(device) at the capture
    int seen = 0;
  };
  void capture(Entry& g, cudaStream_t stream, const std::function<void()>& step);

  bool on_;
  std::map<Key, Entry> graphs_;
  Guard guard_;
};

}  // namespace flashlite::engine::cuda_ops
