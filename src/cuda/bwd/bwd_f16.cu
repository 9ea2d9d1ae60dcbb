// The CUDA backward, fp16: head_dim 64, 96, 128 (bwd_kernels.cuh).
#include "cuda/bwd/bwd_launch.cuh"

namespace flashlite::cuda_bwd {

void launch_delta_f16(const BwdParams& p, cudaStream_t stream) { launch_delta<__half>(p, stream); }

void launch_backward_f16(const BwdParams& p, cudaStream_t stream) { launch_backward<__half>(p, stream); }

void launch_zero_rows_f16(void* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows, int heads,
                          int d, cudaStream_t stream) {
  launch_zero_rows<__half>(base, row_stride, head_stride, row0, rows, heads, d, stream);
}

}  // namespace flashlite::cuda_bwd
