// Step 4 of the split path: O = P V for every (sequence, q head), one batched tiled GEMM. P is the fp32 workspace,
// V is read in its dtype with its strides (kv_head = q_head / group), O is written in q's dtype with out's strides.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/check.h"
#include "cuda/common/dtype.cuh"
#include "cuda/naive/naive_params.h"
#include "cuda/naive/tile.cuh"

namespace flashlite::cuda_naive {
namespace {

// grid: (head_dim tiles, query tiles (strided), pairs (strided)); block: kThreads.
template <class T>
__global__ void __launch_bounds__(kThreads) pv_kernel(const NaiveParams p) {
  __shared__ __align__(16) SharedTiles tiles;
  const int t = int(threadIdx.x);
  const int64_t n0 = int64_t(blockIdx.x) * kTileN;  // first head_dim column of the tile
  for (int64_t bh = blockIdx.z; bh < p.pairs(); bh += gridDim.z) {
    const int64_t b = bh / p.q_heads, h = bh % p.q_heads, kvh = h / p.group;
    const SeqView s = seq_view(p, b);
    const T* v = static_cast<const T*>(p.v) + p.v_stride.offset(s.tb, s.k_row0, kvh);
    T* o = static_cast<T*>(p.out) + p.out_stride.offset(s.tb, s.q_row0, h);
    const float* P = p.s + bh * p.seq_q * p.seq_k;  // (seq_q, seq_k) of this pair
    for (int64_t i0 = int64_t(blockIdx.y) * kTileM; i0 < s.sq; i0 += int64_t(gridDim.y) * kTileM) {
      // fp32 sums over kFoldKeys keys, folded into float64 totals: the error of a short row at any length
      // (docs/numerics.md, long rows).
      constexpr int64_t kFoldKeys = 2048;
      float acc[4][4] = {};
      double total[4][4] = {};
      for (int64_t j0 = 0; j0 < s.sk; j0 += kTileK) {
        if (j0 % kFoldKeys == 0 && j0 > 0) {
#pragma unroll
          for (int rr = 0; rr < 4; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) total[rr][cc] += acc[rr][cc], acc[rr][cc] = 0.f;
        }
        {  // P: 64 rows x 16 keys, 4 consecutive keys of one row per thread
          const int r = t / 4, c0 = (t % 4) * 4;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t j = j0 + c0 + e;
            tiles.a[c0 + e][r] = j < s.sk && i0 + r < s.sq ? P[(i0 + r) * p.seq_k + j] : 0.f;
          }
        }
        {  // V: 16 keys x 64 head_dim columns, 4 consecutive columns of one key per thread
          const int r = t / 16, c0 = (t % 16) * 4;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t n = n0 + c0 + e;
            const bool in = n < p.head_dim && j0 + r < s.sk;
            tiles.b[r][c0 + e] = in ? cuda::load_f32(v, (j0 + r) * p.v_stride.seq + n) : 0.f;
          }
        }
        __syncthreads();
        tile_fma(tiles, acc);
        __syncthreads();
      }
      // Rows with no keys (seq_k 0) get zeros, like every fully masked row.
      store_micro_tile(i0, n0, s.sq, p.head_dim, [&](int64_t i, int64_t n, int rr, int cc) {
        cuda::store_f32(o, i * p.out_stride.seq + n, float(total[rr][cc] + acc[rr][cc]));
      });
    }
  }
}

}  // namespace

template <class T>
void launch_pv(const NaiveParams& p, void* stream) {
  const dim3 grid(unsigned((p.head_dim + kTileN - 1) / kTileN), grid_cap((p.seq_q + kTileM - 1) / kTileM),
                  grid_cap(p.pairs()));
  pv_kernel<T><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH("naive pv_kernel (O = P V)");
}

template void launch_pv<float>(const NaiveParams&, void*);
template void launch_pv<__half>(const NaiveParams&, void*);
template void launch_pv<__nv_bfloat16>(const NaiveParams&, void*);

}  // namespace flashlite::cuda_naive
