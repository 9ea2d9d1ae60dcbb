#pragma once
// The device primitives of the decode kernels, taken in from the shared headers: the PTX wrappers
// (src/cuda/common/ptx.cuh: cp.async, ldmatrix, mma.sync m16n8k16, ex2, shuffles), fp32 -> fp16 / bf16 conversion
// (src/cuda/common/dtype.cuh) and the programmatic-dependent-launch controls (src/cuda/common/pdl.cuh, sm_90).
#include "cuda/common/dtype.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx.cuh"

namespace flashlite::cuda_decode {

using namespace ::flashlite::cuda;  // every primitive above by its name (cuda_decode redefines none of them)

}  // namespace flashlite::cuda_decode
