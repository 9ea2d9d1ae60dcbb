// The Hopper backward kernels, __half, head_dim 128 (sm_90a only; see bwd_hopper_kernel.cuh).
#include "cuda/bwd_hopper/bwd_hopper_kernel.cuh"

namespace flashlite::cuda_bwd_hopper {

template cudaError_t launch_bwd_hopper_variant<__half, 128>(const HopperBwdParams&, cudaStream_t);

}  // namespace flashlite::cuda_bwd_hopper
