// The Hopper forward kernel, __nv_bfloat16, head_dim 64, the three consumer schedules (sm_90a only; see
// hopper_kernel.cuh).
#include "cuda/fwd_hopper/hopper_kernel.cuh"

namespace flashlite::cuda_fwd_hopper {

template cudaError_t launch_hopper_variant<__nv_bfloat16, 64, 1>(const HopperParams&, cudaStream_t);
template cudaError_t launch_hopper_variant<__nv_bfloat16, 64, 2>(const HopperParams&, cudaStream_t);
template cudaError_t launch_hopper_variant<__nv_bfloat16, 64, 3>(const HopperParams&, cudaStream_t);

}  // namespace flashlite::cuda_fwd_hopper
