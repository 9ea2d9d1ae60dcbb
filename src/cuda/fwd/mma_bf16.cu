// The tensor-core forward kernel instantiated for __nv_bfloat16: exactly the configurations of FL_FWD_MMA_CONFIGS.
#include "cuda/fwd/fwd_mma.cuh"

namespace flashlite::cuda_fwd {

void launch_fwd_mma_bf16(MmaConfig c, const FwdParams& p, cudaStream_t stream) {
  switch (c) {
#define FL_FWD_CASE(name, d, br, bc, w, s, q, f) \
  case MmaConfig::name: launch_fwd_mma<__nv_bfloat16, MmaTile<d, br, bc, w, s, q, f>>(p, stream); return;
    FL_FWD_MMA_CONFIGS(FL_FWD_CASE)
#undef FL_FWD_CASE
  }
}

}  // namespace flashlite::cuda_fwd
