#include "cuda/common/context_cache.h"

#include <cuda.h>  // CUcontext, CUresult (types only: the driver is reached through the runtime's entry-point query)
#include <cuda_runtime.h>

namespace flashlite::cuda {
namespace {

using GetCurrent = CUresult (*)(CUcontext*);
using GetId = CUresult (*)(CUcontext, unsigned long long*);

template <class F>
F driver_function(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<F>(f);
}

}  // namespace

uint64_t current_context_id() {
  static const GetCurrent get_current = driver_function<GetCurrent>("cuCtxGetCurrent");
  static const GetId get_id = driver_function<GetId>("cuCtxGetId");
  if (get_current == nullptr || get_id == nullptr) return 0;
  CUcontext ctx = nullptr;
  unsigned long long id = 0;
  if (get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr || get_id(ctx, &id) != CUDA_SUCCESS) return 0;
  return id;
}

}  // namespace flashlite::cuda
