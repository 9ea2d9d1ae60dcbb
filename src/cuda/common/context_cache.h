#pragma once
// Kernel attributes (the shared-memory opt-in, the carveout) belong to a CUDA context: cudaDeviceReset destroys the
// primary context and every attribute set in it. A PerContextFlag remembers, per device, the context its one-time
// work was done in (cuCtxGetId: unique within the process), so that work is redone once in a new context instead of
// launches failing with "invalid argument" after a reset.
#include <atomic>
#include <cstdint>

namespace flashlite::cuda {

// The id of the calling thread's current context; 0 when there is none yet (the next runtime call creates the
// primary context) or the driver lacks cuCtxGetId (then nothing counts as done for long: redone each call).
uint64_t current_context_id();

struct PerContextFlag {
  std::atomic<uint64_t> context[64] = {};  // per device (index & 63): the context the work was done in; 0 = never

  bool done(int dev) const {
    const uint64_t id = current_context_id();
    return id != 0 && context[dev & 63].load(std::memory_order_acquire) == id;
  }
  // After the work succeeded (the work itself made the context current if it was not).
  void mark(int dev) { context[dev & 63].store(current_context_id(), std::memory_order_release); }
};

}  // namespace flashlite::cuda
