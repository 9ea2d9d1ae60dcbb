#pragma once
// Test helper (delayed_copy.cu): a one-block kernel that lets its programmatic dependents launch at once, spins for
// `spin_us` microseconds and only then copies each segment's bytes: a predecessor that writes a decode's inputs late,
// while the decode's blocks already run (DecodeArgs::prefix_ready reads part of them before griddepcontrol.wait).
#include <cuda_runtime.h>

namespace kvtest {

struct CopySegment {
  void* dst;
  const void* src;
  long long bytes;
};

// segments: a device array of n segments.
cudaError_t launch_delayed_copy(const CopySegment* segments, int n, int spin_us, cudaStream_t stream);

}  // namespace kvtest
