#pragma once
// Test helper (delayed_store.cu): a one-block kernel that lets its programmatic dependents launch at once, spins for
// `spin_us` microseconds and only then writes `value` to `*word`: a predecessor that changes a decode's length while
// the decode's blocks already run (they read it before griddepcontrol.wait, speculatively).
#include <cuda_runtime.h>

namespace kvtest {
cudaError_t launch_delayed_store(int* word, int value, int spin_us, cudaStream_t stream);
}  // namespace kvtest
