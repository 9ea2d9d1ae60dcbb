// Step 1 of the split path: S = Q K^T for every (sequence, q head), one batched tiled GEMM. Q and K are read in
// their own dtype with their strides (no copies); a q head reads the K of kv_head = q_head / group (GQA).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/check.h"
#include "cuda/common/dtype.cuh"
#include "cuda/naive/naive_params.h"
#include "cuda/naive/tile.cuh"

namespace flashlite::cuda_naive {
namespace {

// grid: (key tiles, query tiles (strided), pairs (strided)); block: kThreads.
template <class T>
__global__ void __launch_bounds__(kThreads) scores_kernel(const NaiveParams p) {
  __shared__ __align__(16) SharedTiles tiles;
  const int t = int(threadIdx.x);
  const int64_t j0 = int64_t(blockIdx.x) * kTileN;
  for (int64_t bh = blockIdx.z; bh < p.pairs(); bh += gridDim.z) {
    const int64_t b = bh / p.q_heads, h = bh % p.q_heads, kvh = h / p.group;
    const SeqView s = seq_view(p, b);
    const T* q = static_cast<const T*>(p.q) + p.q_stride.offset(s.tb, s.q_row0, h);
    const T* k = static_cast<const T*>(p.k) + p.k_stride.offset(s.tb, s.k_row0, kvh);
    float* S = p.s + bh * p.seq_q * p.seq_k;  // (seq_q, seq_k) of this pair
    for (int64_t i0 = int64_t(blockIdx.y) * kTileM; i0 < s.sq; i0 += int64_t(gridDim.y) * kTileM) {
      if (j0 >= s.sk) break;  // uniform over the block
      float acc[4][4] = {};
      for (int64_t d0 = 0; d0 < p.head_dim; d0 += kTileK) {
        // 64 rows x 16 columns of Q and of K: each thread loads 4 consecutive head_dim elements of one row.
        const int r = t / 4, c0 = (t % 4) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t d = d0 + c0 + e;
          const bool din = d < p.head_dim;
          tiles.a[c0 + e][r] = din && i0 + r < s.sq ? cuda::load_f32(q, (i0 + r) * p.q_stride.seq + d) : 0.f;
          tiles.b[c0 + e][r] = din && j0 + r < s.sk ? cuda::load_f32(k, (j0 + r) * p.k_stride.seq + d) : 0.f;
        }
        __syncthreads();
        tile_fma(tiles, acc);
        __syncthreads();
      }
      store_micro_tile(i0, j0, s.sq, s.sk,
                       [&](int64_t i, int64_t j, int rr, int cc) { S[i * p.seq_k + j] = acc[rr][cc]; });
    }
  }
}

}  // namespace

template <class T>
void launch_scores(const NaiveParams& p, void* stream) {
  if (p.seq_k == 0) return;  // every row is fully masked; the softmax step writes them
  const dim3 grid(unsigned((p.seq_k + kTileN - 1) / kTileN), grid_cap((p.seq_q + kTileM - 1) / kTileM),
                  grid_cap(p.pairs()));
  scores_kernel<T><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH("naive scores_kernel (S = Q K^T)");
}

template void launch_scores<float>(const NaiveParams&, void*);
template void launch_scores<__half>(const NaiveParams&, void*);
template void launch_scores<__nv_bfloat16>(const NaiveParams&, void*);

}  // namespace flashlite::cuda_naive
