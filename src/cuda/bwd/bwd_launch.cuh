#pragma once
// The launch sequence of the CUDA backward for one dtype (included by bwd_f16.cu and bwd_bf16.cu only).
#include <cuda_runtime.h>

#include "cuda/bwd/bwd_kernels.cuh"
#include "cuda/bwd/bwd_launch.h"
#include "cuda/common/check.h"
#include "cuda/common/context_cache.h"
#include "cuda/fwd/fwd_launch.h"  // ensure_smem_optin

namespace flashlite::cuda_bwd {

template <class T, int D>
void launch_backward_d(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdTile<D>;
  static cuda::PerContextFlag dkdv_optin, dq_optin;
  if constexpr (Cfg::SMEM_DKDV > 48 * 1024) cuda_fwd::ensure_smem_optin(bwd_dkdv_kernel<T, Cfg>, Cfg::SMEM_DKDV, dkdv_optin);
  if constexpr (Cfg::SMEM_DQ > 48 * 1024) cuda_fwd::ensure_smem_optin(bwd_dq_kernel<T, Cfg>, Cfg::SMEM_DQ, dq_optin);
  const int64_t kv_blocks = int64_t(p.batch) * p.kv_heads * p.k_tiles;
  if (kv_blocks > 0) {
    bwd_dkdv_kernel<T, Cfg><<<unsigned(kv_blocks), Cfg::THREADS, Cfg::SMEM_DKDV, stream>>>(p);
    FL_CUDA_CHECK_LAUNCH("bwd_dkdv_kernel");
  }
  const int64_t q_blocks = int64_t(p.batch) * p.q_heads * p.q_tiles;
  if (q_blocks > 0) {
    bwd_dq_kernel<T, Cfg><<<unsigned(q_blocks), Cfg::THREADS, Cfg::SMEM_DQ, stream>>>(p);
    FL_CUDA_CHECK_LAUNCH("bwd_dq_kernel");
  }
}

template <class T>
void launch_delta(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.tensor_batch) * p.rows_q * p.q_heads;
  if (rows <= 0) return;
  const bool vec = p.head_dim % 8 == 0 && p.head_dim <= 8 * 32 &&  // one 16-byte chunk per lane
                   rows_16byte_aligned(p.out, p.out_stride, p.tensor_batch, p.q_heads) &&
                   rows_16byte_aligned(p.dout, p.dout_stride, p.tensor_batch, p.q_heads);
  int lanes = 32;
  if (vec) {
    lanes = 1;
    while (lanes < 32 && 8 * lanes < p.head_dim) lanes *= 2;  // the chunks of a row, rounded up to a power of two
  }
  constexpr int kThreads = 256;
  const int64_t per_block = int64_t(kThreads / lanes) * kDeltaRows;
  const unsigned blocks = unsigned((rows + per_block - 1) / per_block);
  // 32-bit item indices while the last block's stay below 2^32 (the divisions splitting an item are then 32-bit)
  const bool index32 = int64_t(blocks) * per_block < (int64_t(1) << 32);
  if (vec) {
    index32 ? bwd_delta_kernel<T, true, uint32_t><<<blocks, kThreads, 0, stream>>>(p, lanes)
           : bwd_delta_kernel<T, true, int64_t><<<blocks, kThreads, 0, stream>>>(p, lanes);
  } else {
    index32 ? bwd_delta_kernel<T, false, uint32_t><<<blocks, kThreads, 0, stream>>>(p, lanes)
           : bwd_delta_kernel<T, false, int64_t><<<blocks, kThreads, 0, stream>>>(p, lanes);
  }
  FL_CUDA_CHECK_LAUNCH("bwd_delta_kernel");
}

template <class T>
void launch_backward(const BwdParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: launch_backward_d<T, 64>(p, stream); break;
    case 96: launch_backward_d<T, 96>(p, stream); break;
    case 128: launch_backward_d<T, 128>(p, stream); break;
    default: throw Error(ErrorKind::runtime, "internal error: CUDA backward called with head_dim " + std::to_string(p.head_dim));
  }
}

template <class T>
void launch_zero_rows(void* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows, int heads, int d,
                      cudaStream_t stream) {
  const int64_t n = rows * heads * d;
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  bwd_zero_rows_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(static_cast<T*>(base), row_stride, head_stride, row0,
                                                                 rows, heads, d);
  FL_CUDA_CHECK_LAUNCH("bwd_zero_rows_kernel");
}

}  // namespace flashlite::cuda_bwd
