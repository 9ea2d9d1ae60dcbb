#pragma once
// The decode kernel instances (host view): one split kernel and one combine kernel per dtype and head_dim, compiled
// in decode_bf16.cu / decode_f16.cu (one file per dtype so they build in parallel). Launched by launch.cu.
namespace flashlite::cuda_decode {

struct DecodeKernels {
  const void* split = nullptr;    // decode_split_kernel<T, D>
  const void* combine = nullptr;  // decode_combine_kernel<T, D>
  int split_smem_bytes = 0;       // dynamic shared memory of the split kernel
};

// D is 64 or 128 (launch.cu checks).
DecodeKernels decode_kernels_bf16(int head_dim);
DecodeKernels decode_kernels_f16(int head_dim);

}  // namespace flashlite::cuda_decode
