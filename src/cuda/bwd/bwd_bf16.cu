// The CUDA backward, bf16: head_dim 64, 96, 128 (bwd_kernels.cuh).
#include "cuda/bwd/bwd_launch.cuh"

namespace flashlite::cuda_bwd {

void launch_delta_bf16(const BwdParams& p, cudaStream_t stream) { launch_delta<__nv_bfloat16>(p, stream); }

void launch_backward_bf16(const BwdParams& p, cudaStream_t stream) { launch_backward<__nv_bfloat16>(p, stream); }

void launch_zero_rows_bf16(void* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows, int heads,
                          int d, cudaStream_t stream) {
  launch_zero_rows<__nv_bfloat16>(base, row_stride, head_stride, row0, rows, heads, d, stream);
}

}  // namespace flashlite::cuda_bwd
