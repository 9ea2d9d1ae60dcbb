#pragma once
// The decode kernel instances (host view): one split kernel and one combine kernel per dtype and head_dim, compiled
// in decode_bf16.cu / decode_f16.cu (one file per dtype so they build in parallel). Launched by launch.cu.
namespace flashlite::cuda_decode {

struct DecodeKernels {
  const void* split = nullptr;    // decode_split_kernel<T, D, prefix_ready>
  const void* combine = nullptr;  // decode_combine_kernel<T, D>
  int split_smem_bytes = 0;       // dynamic shared memory of the split kernel
};

// D is 64 or 128 (launch.cu checks); prefix_ready: DecodeArgs::prefix_ready's instance of the split kernel.
DecodeKernels decode_kernels_bf16(int head_dim, bool prefix_ready);
DecodeKernels decode_kernels_f16(int head_dim, bool prefix_ready);

}  // namespace flashlite::cuda_decode
