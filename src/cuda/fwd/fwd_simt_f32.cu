// The fused forward kernel for fp32 inputs: plain FMA on the SIMT cores (no tensor cores: tf32 would miss the
// 1e-4 max-abs-error bar), same work split, tile skipping, mask and online softmax as the tensor-core kernel.
//
// A block of 4 warps owns 16 query rows (4 per warp); key tiles of 32 keys, one key per lane for Q K^T (K stored
// with a one-float pad so lane j reads row j without bank conflicts), one output dimension per lane (and every 32nd
// after it) for P V, the probabilities broadcast by shuffles.
#include <cuda_runtime.h>

#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/fwd_launch.h"

namespace flashlite::cuda_fwd {
namespace {

constexpr int kWarps = 4, kRowsPerWarp = 4, kRows = kWarps * kRowsPerWarp, kKeys = 32;

template <int D>
struct SimtSmem {
  static constexpr int KLD = D + 1;  // K row stride: lane j reads K[j][d] from bank (j + d) % 32
  static constexpr int BYTES = (kKeys * KLD + kKeys * D + kRows * D) * 4;
};

template <int D>
__global__ void __launch_bounds__(kWarps * 32) fwd_simt_f32_kernel(const __grid_constant__ FwdParams p) {
  constexpr int KLD = SimtSmem<D>::KLD, U = D / 32;
  extern __shared__ float sm[];
  float* sK = sm;                 // (kKeys, KLD)
  float* sV = sK + kKeys * KLD;   // (kKeys, D)
  float* sQ = sV + kKeys * D;     // (kRows, D)

  BlockWork w;
  if (!decode_block(p, kRows, w, int(blockIdx.x))) return;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int sq = w.sq, sk = w.sk;
  const int i0 = w.tile * kRows, i1 = min(i0 + kRows, sq);
  const KeyTiles kt = key_tiles(p.mask, i0, i1, sq, sk, kKeys);
  const int kvh = w.head / p.group;
  const float* qg = static_cast<const float*>(p.q) + w.tb * p.q_stride.batch + w.q_row0 * p.q_stride.seq +
      w.head * p.q_stride.head;
  const float* kg = static_cast<const float*>(p.k) + w.tb * p.k_stride.batch + w.k_row0 * p.k_stride.seq +
      kvh * p.k_stride.head;
  const float* vg = static_cast<const float*>(p.v) + w.tb * p.v_stride.batch + w.k_row0 * p.v_stride.seq +
      kvh * p.v_stride.head;

  for (int c = tid; c < kRows * D; c += kWarps * 32) {
    const int r = c / D, d = c % D;
    sQ[c] = i0 + r < sq ? qg[int64_t(i0 + r) * p.q_stride.seq + d] : 0.f;
  }

  const int wr0 = i0 + warp * kRowsPerWarp, wr1 = min(wr0 + kRowsPerWarp, sq);
  // o and l are fp32 sums over kFoldTiles tiles, then folded into float64 totals kept at the same running max: the
  // error of a 2048-key row at any length (one fp32 sum over 2^22 keys was 3e-5 off; docs/numerics.md).
  constexpr int kFoldTiles = 2048 / kKeys;
  float o[kRowsPerWarp][U], m_run[kRowsPerWarp], l_run[kRowsPerWarp];
  double o_tot[kRowsPerWarp][U], l_tot[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.f;
    l_tot[r] = 0.0;
#pragma unroll
    for (int u = 0; u < U; ++u) o[r][u] = 0.f, o_tot[r][u] = 0.0;
  }

  for (int n = 0; n < kt.count; ++n) {
    if (n > 0 && n % kFoldTiles == 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        l_tot[r] += l_run[r], l_run[r] = 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u) o_tot[r][u] += o[r][u], o[r][u] = 0.f;
      }
    }
    const int j0 = kt.tile(n) * kKeys;
    __syncthreads();  // the previous tile is consumed (and sQ written, the first time)
    for (int c = tid; c < kKeys * D; c += kWarps * 32) {
      const int r = c / D, d = c % D;
      const bool ok = j0 + r < sk;
      sK[r * KLD + d] = ok ? kg[int64_t(j0 + r) * p.k_stride.seq + d] : 0.f;
      sV[c] = ok ? vg[int64_t(j0 + r) * p.v_stride.seq + d] : 0.f;
    }
    __syncthreads();

    // Scores of key j0 + lane for the warp's rows.
    float x[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) x[r] = 0.f;
    const float* krow = sK + lane * KLD;
    const float* qrow = sQ + warp * kRowsPerWarp * D;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float kv = krow[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) x[r] = fmaf(qrow[r * D + d], kv, x[r]);
    }
    const bool full = wr0 >= sq || (j0 + kKeys <= sk && tile_fully_visible(p.mask, wr0, wr1, j0, j0 + kKeys, sq, sk));
    const int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float s = p.softcap ? p.softcap_post * tanhf(x[r] * p.softcap_pre) : x[r] * p.scale_log2;
      if (!full && (j >= sk || !key_visible(p.mask, wr0 + r, j, sq, sk))) s = -INFINITY;
      float mx = s;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_run[r] - m_use);
      m_run[r] = m_new;
      x[r] = exp2f(s - m_use);
      l_run[r] = l_run[r] * alpha + x[r];  // per-lane partial sum, reduced at the end
#pragma unroll
      for (int u = 0; u < U; ++u) o[r][u] *= alpha;
      if (alpha != 1.f && n >= kFoldTiles) {  // uniform over the warp (m_run is the row's); rare after the start
        l_tot[r] *= alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) o_tot[r][u] *= alpha;
      }
    }
    // O += P V: lane owns dimensions lane, lane + 32, ...
#pragma unroll 4
    for (int jj = 0; jj < kKeys; ++jj) {
      float v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = sV[jj * D + lane + 32 * u];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float pj = __shfl_sync(0xffffffffu, x[r], jj);
#pragma unroll
        for (int u = 0; u < U; ++u) o[r][u] = fmaf(pj, v[u], o[r][u]);
      }
    }
  }

  const float sink2 = p.sink_logits ? p.sink_logits[w.head] * kLog2e : -INFINITY;
  float* og = static_cast<float*>(p.out) + w.tb * p.out_stride.batch + w.q_row0 * p.out_stride.seq +
      w.head * p.out_stride.head;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float l = float(l_tot[r] + l_run[r]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    float lse;
    const float f = finish_row(m_run[r], l, sink2, lse);
    const int i = wr0 + r;
    if (i >= sq) continue;
#pragma unroll
    for (int u = 0; u < U; ++u) og[int64_t(i) * p.out_stride.seq + lane + 32 * u] = float(o_tot[r][u] + o[r][u]) * f;
    if (p.lse && lane == 0) {
      p.lse[w.tb * p.lse_stride.batch + w.head * p.lse_stride.head + (w.q_row0 + i) * p.lse_stride.seq] = lse;
    }
  }
}

template <int D>
void launch_d(const FwdParams& p, cudaStream_t stream) {
  constexpr int bytes = SimtSmem<D>::BYTES;
  static cuda::PerContextFlag configured;
  if constexpr (bytes > 48 * 1024) ensure_smem_optin(fwd_simt_f32_kernel<D>, bytes, configured);
  const int64_t blocks = int64_t(p.q_tiles) * p.q_heads * p.batch;
  fwd_simt_f32_kernel<D><<<unsigned(blocks), kWarps * 32, bytes, stream>>>(p);
}

}  // namespace

int simt_f32_block_rows() { return kRows; }

void launch_fwd_simt_f32(int head_dim, const FwdParams& p, cudaStream_t stream) {
  switch (head_dim) {
    case 32: launch_d<32>(p, stream); break;
    case 64: launch_d<64>(p, stream); break;
    case 96: launch_d<96>(p, stream); break;
    case 128: launch_d<128>(p, stream); break;
    case 256: launch_d<256>(p, stream); break;
    default: break;  // unreachable: plan_cuda_fused rejects other head dims
  }
}

}  // namespace flashlite::cuda_fwd
