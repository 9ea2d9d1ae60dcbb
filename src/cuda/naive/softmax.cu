// Steps 2 and 3 of the split path, both over the fp32 score workspace:
//   scale_mask: s = scale * s, softcap, then -inf where src/common/mask.h's key_visible says the key is hidden;
//   softmax:    one block per row: max, then sum of exp (shared-memory tree reductions), P = exp(s - max) / sum in
//               place, LSE. The sink logit (natural-log units) joins the max and the denominator only.
// A row with no visible key gets P = 0 (so O = 0) and LSE = -inf, or the sink logit when there is one.
#include <cmath>

#include "cuda/common/check.h"
#include "cuda/naive/naive_params.h"
#include "cuda/naive/tile.cuh"

namespace flashlite::cuda_naive {
namespace {

inline constexpr int kRowThreads = 256;

// grid: (query rows, pairs (strided)); block: kRowThreads threads stride over the row's keys.
__global__ void __launch_bounds__(kRowThreads) scale_mask_kernel(const NaiveParams p) {
  const int64_t i = blockIdx.x;
  for (int64_t bh = blockIdx.y; bh < p.pairs(); bh += gridDim.y) {
    const SeqView s = seq_view(p, bh / p.q_heads);
    if (i >= s.sq) continue;
    float* row = p.s + (bh * p.seq_q + i) * p.seq_k;
    for (int64_t j = threadIdx.x; j < s.sk; j += blockDim.x) {
      float x = row[j] * p.scale;
      if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
      row[j] = key_visible(p.mask, i, j, s.sq, s.sk) ? x : -INFINITY;
    }
  }
}

// Tree reduction over the block in shared memory (kRowThreads is a power of two). Returns the result to every thread.
template <class F, class Op>
__device__ __forceinline__ F block_reduce(F x, F* red, Op op) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) red[threadIdx.x] = op(red[threadIdx.x], red[threadIdx.x + half]);
    __syncthreads();
  }
  const F r = red[0];
  __syncthreads();  // red is reused by the next reduction
  return r;
}

// The max keeps NaN (fmaxf drops it): a NaN score must make the row NaN (docs/numerics.md).
__device__ __forceinline__ float max_keep_nan(float a, float b) { return a != a ? a : b != b ? b : fmaxf(a, b); }
struct MaxOp {
  __device__ float operator()(float a, float b) const { return max_keep_nan(a, b); }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// grid: (query rows, pairs (strided)); block: kRowThreads.
__global__ void __launch_bounds__(kRowThreads) softmax_kernel(const NaiveParams p) {
  __shared__ float red[kRowThreads];
  __shared__ double red64[kRowThreads];
  const int64_t i = blockIdx.x;
  for (int64_t bh = blockIdx.y; bh < p.pairs(); bh += gridDim.y) {
    const int64_t h = bh % p.q_heads;
    const SeqView s = seq_view(p, bh / p.q_heads);
    if (i >= s.sq) continue;  // uniform over the block
    float* row = p.s + (bh * p.seq_q + i) * p.seq_k;
    const float sink = p.sink_logits ? p.sink_logits[h] : -INFINITY;

    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < s.sk; j += blockDim.x) m = max_keep_nan(m, row[j]);
    m = max_keep_nan(block_reduce(m, red, MaxOp{}), sink);

    // The row sum in float64: an fp32 sum of 2^24 equal terms stops growing (docs/numerics.md, long rows).
    // A NaN or +inf score or sink logit makes m or a term NaN, so l, every P and the LSE turn NaN.
    double l = 0.0;
    if (m != -INFINITY) {  // uniform: m is the block's
      for (int64_t j = threadIdx.x; j < s.sk; j += blockDim.x) l += double(expf(row[j] - m));
    }
    l = block_reduce(l, red64, SumOp{});
    if (sink != -INFINITY) l += double(expf(sink - m));

    const float inv = l == 0.0 ? 0.f : float(1.0 / l);
    for (int64_t j = threadIdx.x; j < s.sk; j += blockDim.x) row[j] = l == 0.0 ? 0.f : expf(row[j] - m) * inv;
    if (p.lse && threadIdx.x == 0) {
      p.lse[p.lse_stride.offset(s.tb, h, s.q_row0 + i)] = l == 0.0 ? -INFINITY : m + float(log(l));
    }
  }
}

}  // namespace

void launch_scale_mask(const NaiveParams& p, void* stream) {
  if (p.seq_k == 0) return;
  scale_mask_kernel<<<dim3(unsigned(p.seq_q), grid_cap(p.pairs())), kRowThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH("naive scale_mask_kernel");
}

void launch_softmax(const NaiveParams& p, void* stream) {
  softmax_kernel<<<dim3(unsigned(p.seq_q), grid_cap(p.pairs())), kRowThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH("naive softmax_kernel");
}

}  // namespace flashlite::cuda_naive
