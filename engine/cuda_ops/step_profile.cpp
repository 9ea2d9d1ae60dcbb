#include "engine/cuda_ops/step_profile.h"

#include <cstdio>

#include "engine/cuda_ops/ops.h"

namespace flashlite::engine::cuda_ops {

StepProfile::~StepProfile() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StepProfile::run(const std::function<void()>& step) {
  flag_.reserve(sizeof(int));
  volatile int* flag = flag_.as<int>();
  *flag = 0;
  int* flag_dev = nullptr;  // the mapped pointer; under unified addressing the host pointer itself
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag_.ptr, 0) != cudaSuccess) {
    cudaGetLastError();
    flag_dev = flag_.as<int>();
  }
  wait_flag(flag_dev, 2000, stream_);
  used_ = 0;
  names_.clear();
  active_ = true;
  try {
    step();
  } catch (...) {
    active_ = false;
    *flag = 1;
    throw;
  }
  active_ = false;
  *flag = 1;
}

void StepProfile::mark(const char* name) {
  if (!active_) return;
  if (used_ >= events_.size()) {
    cudaEvent_t e;
    cuda_check(cudaEventCreate(&e), "profile event");
    events_.push_back(e);
  }
  cuda_check(cudaEventRecord(events_[used_++], stream_), "profile event");
  names_.emplace_back(name);
}

void StepProfile::collect(int rows) {
  Totals& t = totals_[rows];
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "profile timing");
    const std::string& n = names_[i];
    auto [it, fresh] = t.by_name.try_emplace(n, 0.0, 0);
    if (fresh) t.order.push_back(n);
    it->second.first += ms * 1e3;
    it->second.second += 1;
    t.total_us += ms * 1e3;
  }
  if (++t.steps < 16) return;
  std::fprintf(stderr, "flashlite engine profile: rows %d, %d eager decode steps queued behind a flag, %.1f us per step "
                       "(events between kernel groups; PDL overlap and graph replay absent)\n", rows, t.steps,
               t.total_us / t.steps);
  for (const std::string& n : t.order) {
    const auto& [us, count] = t.by_name[n];
    std::fprintf(stderr, "  %-12s %9.1f us/step %5.1f launches/step %8.2f us each\n", n.c_str(), us / t.steps,
                 double(count) / t.steps, us / count);
  }
  std::fflush(stderr);
  t = Totals{};
}

}  // namespace flashlite::engine::cuda_ops
