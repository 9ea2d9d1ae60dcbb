// The Hopper forward kernel, __nv_bfloat16, head_dim 128 (sm_90a only; see hopper_kernel.cuh).
#include "cuda/fwd_hopper/hopper_kernel.cuh"

namespace flashlite::cuda_fwd_hopper {

template cudaError_t launch_hopper_variant<__nv_bfloat16, 128, 2, 1>(const HopperParams&, int, cudaStream_t);
template cudaError_t launch_hopper_variant<__nv_bfloat16, 128, 2, 2>(const HopperParams&, int, cudaStream_t);

}  // namespace flashlite::cuda_fwd_hopper
