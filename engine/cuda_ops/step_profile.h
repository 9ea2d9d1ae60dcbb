#pragma once
// --profile (CudaEngineOptions::profile): decode steps run eagerly (no graph), each queued whole behind a host flag so
// the GPU runs it without waiting for the host's launches, with an event after each kernel group (mark). Every 16
// profiled steps of a batch size, the mean time per group goes to stderr. PDL overlap and graph replay are absent
// from these numbers; they say where a step's time goes, not how long a graph-replayed step takes.
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda_ops/device_buffer.h"

namespace flashlite::engine::cuda_ops {

class StepProfile {
 public:
  explicit StepProfile(cudaStream_t stream) : stream_(stream) {}
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  // Whether this decode step of `rows` rows is profiled. Not the first of each batch size: its kernels (new GEMV
  // instantiations, the decode kernels) load lazily on first launch, and a module load may wait for the context to
  // go idle, i.e. for the flag kernel, which the host releases only after the whole step is queued: a 2 s stall.
  bool wants(int rows) { return ++seen_[rows] > 1; }
  // Queues `step` behind the flag and releases it (also when `step` throws).
  void run(const std::function<void()>& step);
  // Inside run: an event after the kernels queued so far, closing the group `name`. Elsewhere nothing.
  void mark(const char* name);
  bool active() const { return active_; }  // inside run
  // After the profiled step's stream synchronized: adds its group times; prints every 16 steps of this batch size.
  void collect(int rows);

 private:
  struct Totals {
    int steps = 0;
    std::map<std::string, std::pair<double, int>> by_name;  // us summed over steps, launches (groups) over steps
    std::vector<std::string> order;
    double total_us = 0;
  };
  cudaStream_t stream_;
  bool active_ = false;
  std::map<int, int> seen_;  // decode steps seen per batch size
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  std::vector<std::string> names_;  // names_[i] closes at event i
  std::map<int, Totals> totals_;
  PinnedBuffer flag_;
};

}  // namespace flashlite::engine::cuda_ops
