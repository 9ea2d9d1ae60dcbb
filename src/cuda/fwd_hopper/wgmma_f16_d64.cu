// The Hopper forward kernel, __half, head_dim 64 (sm_90a only; see hopper_kernel.cuh).
#include "cuda/fwd_hopper/hopper_kernel.cuh"

namespace flashlite::cuda_fwd_hopper {

template cudaError_t launch_hopper_variant<__half, 64, 2, 2>(const HopperParams&, int, cudaStream_t);
template cudaError_t launch_hopper_variant<__half, 64, 3, 1>(const HopperParams&, int, cudaStream_t);

}  // namespace flashlite::cuda_fwd_hopper
