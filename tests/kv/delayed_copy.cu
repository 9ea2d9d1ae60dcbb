#include "delayed_copy.h"

namespace kvtest {
namespace {

__global__ void delayed_copy_kernel(const CopySegment* segments, int n, long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<long long>(now - start) < spin_ns);
  for (int s = 0; s < n; ++s) {
    char* dst = static_cast<char*>(segments[s].dst);
    const char* src = static_cast<const char*>(segments[s].src);
    for (long long i = threadIdx.x; i < segments[s].bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t launch_delayed_copy(const CopySegment* segments, int n, int spin_us, cudaStream_t stream) {
  delayed_copy_kernel<<<1, 256, 0, stream>>>(segments, n, static_cast<long long>(spin_us) * 1000);
  return cudaGetLastError();
}

}  // namespace kvtest
