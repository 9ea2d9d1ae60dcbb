// The tensor-core forward kernel reading K/V from a KV cache (prefill, CACHE = true), instantiated for __half:
// exactly the configurations of FL_FWD_CACHE_CONFIGS.
#include <string>

#include "cuda/fwd/fwd_mma.cuh"

namespace flashlite::cuda_fwd {

void launch_fwd_mma_cache_f16(MmaConfig c, const FwdParams& p, cudaStream_t stream) {
  switch (c) {
#define FL_FWD_CACHE_CASE(name) \
  case MmaConfig::name: launch_fwd_mma<__half, MmaTileOf<MmaConfig::name>, true>(p, stream); return;
    FL_FWD_CACHE_CONFIGS(FL_FWD_CACHE_CASE)
#undef FL_FWD_CACHE_CASE
    default: break;
  }
  throw Error(ErrorKind::runtime, std::string("fused attention: no KV-cache variant of ") + mma_config_info(c).name);
}

}  // namespace flashlite::cuda_fwd
