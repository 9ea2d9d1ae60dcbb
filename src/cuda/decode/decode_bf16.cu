// Decode kernel instances for bf16 caches (head_dim 64 and 128).
#include "cuda/decode/combine.cuh"
#include "cuda/decode/decode_kernels.h"
#include "cuda/decode/decode_split.cuh"

namespace flashlite::cuda_decode {

DecodeKernels decode_kernels_bf16(int head_dim) {
  if (head_dim == 64) {
    return {reinterpret_cast<const void*>(&decode_split_kernel<__nv_bfloat16, 64>),
            reinterpret_cast<const void*>(&decode_combine_kernel<__nv_bfloat16, 64>), SplitCfg<64>::SMEM_BYTES};
  }
  return {reinterpret_cast<const void*>(&decode_split_kernel<__nv_bfloat16, 128>),
          reinterpret_cast<const void*>(&decode_combine_kernel<__nv_bfloat16, 128>), SplitCfg<128>::SMEM_BYTES};
}

}  // namespace flashlite::cuda_decode
