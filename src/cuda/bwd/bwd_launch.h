#pragma once
// The CUDA backward's launch interface: the head dims that are compiled (everything else is refused by
// cuda_backward_unsupported_reason) and the per-dtype launchers (bwd_f16.cu, bwd_bf16.cu).
#include <cuda_runtime.h>

#include "cuda/bwd/bwd_params.h"

namespace flashlite::cuda_bwd {

inline constexpr bool head_dim_supported(int d) { return d == 64 || d == 96 || d == 128; }

// D = dout . out (less dlse) into p.delta on `stream`: the first step of both kernel families.
void launch_delta_f16(const BwdParams& p, cudaStream_t stream);
void launch_delta_bf16(const BwdParams& p, cudaStream_t stream);
// The mma.sync dK/dV kernel and dQ kernel on `stream`, after launch_delta (launch.cu then sums the dsink shares).
// p.head_dim must be supported; p's workspace pointers set.
void launch_backward_f16(const BwdParams& p, cudaStream_t stream);
void launch_backward_bf16(const BwdParams& p, cudaStream_t stream);

// Zeroes rows [row0, row0 + rows) of a (1, rows, heads, d) gradient of 16-bit elements.
void launch_zero_rows_f16(void* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows, int heads,
                          int d, cudaStream_t stream);
void launch_zero_rows_bf16(void* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows, int heads,
                           int d, cudaStream_t stream);

}  // namespace flashlite::cuda_bwd
