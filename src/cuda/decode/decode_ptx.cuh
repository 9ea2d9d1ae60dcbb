#pragma once
// The device primitives of the decode kernels, taken in from the shared headers: the PTX wrappers
// (src/cuda/common/ptx.cuh: cp.async, ldmatrix, mma.sync m16n8k16, ex2, shuffles), fp32 -> fp16 / bf16 conversion
// (src/cuda/common/dtype.cuh) and the programmatic-dependent-launch controls (src/cuda/common/pdl.cuh, sm_90).
#include "cuda/common/dtype.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx.cuh"

namespace flashlite::cuda_decode {

using ::flashlite::cuda::kLn2;
using ::flashlite::cuda::kLog2e;

using ::flashlite::cuda::cp_async_16;
using ::flashlite::cuda::cp_async_16_l2_256;
using ::flashlite::cuda::cp_async_16_l2_256_policy;
using ::flashlite::cuda::cp_async_16_policy;
using ::flashlite::cuda::cp_async_4;
using ::flashlite::cuda::cp_async_commit;
using ::flashlite::cuda::cp_async_wait;
using ::flashlite::cuda::l2_evict_first_policy;
using ::flashlite::cuda::smem_addr;
using ::flashlite::cuda::st_shared_16;
using ::flashlite::cuda::st_shared_4;
using ::flashlite::cuda::st_shared_f32;
using ::flashlite::cuda::st_shared_f32x2;

using ::flashlite::cuda::fast_exp2;
using ::flashlite::cuda::ldmatrix_x4;
using ::flashlite::cuda::ldmatrix_x4_trans;
using ::flashlite::cuda::mma_16816;
using ::flashlite::cuda::pack2;
using ::flashlite::cuda::quad_max;
using ::flashlite::cuda::quad_sum;
using ::flashlite::cuda::warp_max;
using ::flashlite::cuda::warp_sum;

using ::flashlite::cuda::from_float;

// Programmatic dependent launch: src/cuda/common/pdl.cuh.
using ::flashlite::cuda::pdl_launch_dependents;
using ::flashlite::cuda::pdl_wait;

}  // namespace flashlite::cuda_decode
