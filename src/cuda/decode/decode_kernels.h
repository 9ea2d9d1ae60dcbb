#pragma once
// The decode kernel instances (host view): one split kernel and one combine kernel per dtype and head_dim, compiled
// in decode_bf16.cu / decode_f16.cu (one file per dtype so they build in parallel). Launched by launch.cu.
namespace flashlite::cuda_decode {

// Pipeline stages of the deep split kernel: one block per SM (the cluster-merge grids) with the 6 tiles of K/V in
// flight that two blocks of 3 stages keep.
inline constexpr int kDeepStages = 6;

struct DecodeKernels {
  const void* split = nullptr;    // decode_split_kernel<T, D>
  const void* combine = nullptr;  // decode_combine_kernel<T, D>
  int split_smem_bytes = 0;       // dynamic shared memory of the split kernel
  // decode_split_kernel<T, D, kDeepStages> (head_dim 128 only; null otherwise): one block per SM with the bytes in
  // flight of two, for the grids of at most one block per SM (the cluster merge's).
  const void* split_deep = nullptr;
  int split_deep_smem_bytes = 0;
};

// D is 64 or 128 (launch.cu checks).
DecodeKernels decode_kernels_bf16(int head_dim);
DecodeKernels decode_kernels_f16(int head_dim);

}  // namespace flashlite::cuda_decode
