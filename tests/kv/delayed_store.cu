#include "delayed_store.h"

namespace kvtest {
namespace {

__global__ void delayed_store_kernel(int* word, int value, long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<long long>(now - start) < spin_ns);
  *reinterpret_cast<volatile int*>(word) = value;
}

}  // namespace

cudaError_t launch_delayed_store(int* word, int value, int spin_us, cudaStream_t stream) {
  delayed_store_kernel<<<1, 32, 0, stream>>>(word, value, static_cast<long long>(spin_us) * 1000);
  return cudaGetLastError();
}

}  // namespace kvtest
