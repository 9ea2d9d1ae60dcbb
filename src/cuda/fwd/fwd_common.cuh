#pragma once
// Device helpers shared by the fused forward kernels: which work a block owns, which key tiles it must visit,
// and the few PTX instructions the tensor-core kernel uses (cp.async, ldmatrix, mma.sync, ex2: src/cuda/common/ptx.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mask.h"
#include "common/paged.h"
#include "cuda/common/ptx.cuh"
#include "cuda/fwd/block_order.h"
#include "cuda/fwd/fwd_params.h"

namespace flashlite::cuda_fwd {

using ::flashlite::cuda::kLn2;
using ::flashlite::cuda::kLog2e;

// ------------------------------------------------------------------ work decomposition

// One block: a tile of query rows of one head of one sequence.
struct BlockWork {
  int seq;          // sequence (batch index, or varlen sequence)
  int head;         // q head
  int tile;         // query tile within the sequence
  int sq, sk;       // lengths of this sequence
  int64_t q_row0;   // first tensor row of the sequence (varlen), 0 when padded
  int64_t k_row0;
  int64_t tb;       // tensor batch index: seq when padded, 0 when varlen
};

// Length of sequence b in a KV cache, from the cache's device index (prefill, CACHE kernels).
__device__ __forceinline__ int cache_length(const FwdParams& p, int b) {
  if (!p.paged) return p.seq_lens[b];
  const int pages = p.indptr[b + 1] - p.indptr[b];
  return paged_length<int>(pages, p.page_size, p.last_page_len, b);
}

// 1-D grid over (sequence, head) pairs and tile ranks (block_order.h). Pair-major (default): a pair's tiles run side by
// side and share its K/V in L2 (neighbouring heads share a GQA group's K/V too). Rank-major (causal): rank 0 of every
// pair of a group first; with reverse_tiles a sequence's heaviest query tile (its last) has rank 0, so the longest
// blocks start first (longest-job-first balancing across the SMs). Returns false when the rank lies past the
// sequence's tiles. block: the block's index in that grid (blockIdx.x, or a persistent CTA's current tile).
// CACHE (prefill): q rows as usual (padded or ragged), keys from the cache: sk = the sequence's cache length and
// k_row0 = 0 (the kernel addresses K/V through the sequence index, contiguous or paged).
template <bool CACHE = false>
__device__ __forceinline__ bool decode_block(const FwdParams& p, int block_rows, BlockWork& w, int block) {
  const PairRank pr = block_pair_rank(block, p.q_heads * p.batch, p.q_tiles, p.rank_major, p.rank_group);
  const int pair = pr.pair, rank = pr.rank;
  w.head = pair % p.q_heads;
  w.seq = pair / p.q_heads;
  if constexpr (CACHE) {
    w.sk = cache_length(p, w.seq);
    w.k_row0 = 0;
    if (p.varlen == VarlenMode::padded) {
      w.sq = p.seq_q;
      w.q_row0 = 0;
      w.tb = w.seq;
    } else {
      const int* cq = p.varlen == VarlenMode::inline_table ? p.cu_inline[0] : p.cu_dev;
      w.q_row0 = cq[w.seq];
      w.sq = cq[w.seq + 1] - cq[w.seq];
      w.tb = 0;
    }
  } else if (p.varlen == VarlenMode::padded) {
    w.sq = p.seq_q;
    w.sk = p.seq_k;
    w.q_row0 = w.k_row0 = 0;
    w.tb = w.seq;
  } else {
    const int* cq = p.varlen == VarlenMode::inline_table ? p.cu_inline[0] : p.cu_dev;
    const int* ck = p.varlen == VarlenMode::inline_table ? p.cu_inline[1] : p.cu_dev + p.batch + 1;
    w.q_row0 = cq[w.seq];
    w.k_row0 = ck[w.seq];
    w.sq = cq[w.seq + 1] - cq[w.seq];
    w.sk = ck[w.seq + 1] - ck[w.seq];
    w.tb = 0;
  }
  const int tiles = (w.sq + block_rows - 1) / block_rows;
  if (rank >= tiles) return false;
  w.tile = p.reverse_tiles ? tiles - 1 - rank : rank;
  return true;
}

// The key tiles a block visits, in order: first the tiles holding sink tokens, then the tiles of the window/causal
// range that were not already visited. Tiles outside both are never loaded or computed.
struct KeyTiles {
  int n_sink;     // tiles [0, n_sink)
  int win_first;  // then tiles win_first, win_first + 1, ...
  int count;      // total tiles
  __device__ __forceinline__ int tile(int n) const { return n < n_sink ? n : win_first + (n - n_sink); }
};

__device__ __forceinline__ KeyTiles key_tiles(const MaskParams& m, int i0, int i1, int sq, int sk, int bc) {
  const RowsKeys r = rows_keys(m, i0, i1, sq, sk);
  KeyTiles t;
  t.n_sink = (r.sink_end + bc - 1) / bc;
  int first = r.win_begin / bc, last = (r.win_end + bc - 1) / bc;
  if (r.win_end <= r.win_begin) first = last = 0;
  if (first < t.n_sink) first = t.n_sink;
  t.win_first = first;
  t.count = t.n_sink + (last > first ? last - first : 0);
  return t;
}

// ------------------------------------------------------------------ PTX wrappers (src/cuda/common/ptx.cuh)

using ::flashlite::cuda::cp_async_16;
using ::flashlite::cuda::cp_async_commit;
using ::flashlite::cuda::cp_async_wait;
using ::flashlite::cuda::fast_exp2;
using ::flashlite::cuda::ldmatrix_x4;
using ::flashlite::cuda::load_chunk;
using ::flashlite::cuda::ldmatrix_x4_trans;
using ::flashlite::cuda::mma_16816;
using ::flashlite::cuda::pack2;
using ::flashlite::cuda::quad_max;
using ::flashlite::cuda::quad_sum;
using ::flashlite::cuda::smem_addr;
using ::flashlite::cuda::st_shared_16;

// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error ~1e-7 (tanh.approx's 2^-11 relative error would move a capped
// logit of 30 by 0.015, visible in the LSE).
__device__ __forceinline__ float accurate_tanh(float x) {
  const float e = fast_exp2(2.f * kLog2e * x);
  return 1.f - __fdividef(2.f, e + 1.f);
}

// Final normalisation of one row: the sink logit (log2 units, -inf when absent) joins the denominator.
// m: running max (log2 units, -inf when no key was visible), l: running sum relative to m.
// Returns the factor that multiplies the accumulator; writes the natural-log LSE.
__device__ __forceinline__ float finish_row(float m, float l, float sink2, float& lse) {
  const float mf = fmaxf(m, sink2);
  const float fac = m == -INFINITY ? 0.f : fast_exp2(m - mf);
  const float lf = l * fac + (sink2 == -INFINITY ? 0.f : fast_exp2(sink2 - mf));
  // lf is NaN when a visible score or the sink logit was NaN or +inf (docs/numerics.md): out and LSE NaN.
  lse = lf == 0.f ? -INFINITY : (mf + __log2f(lf)) * kLn2;
  return lf == 0.f ? 0.f : fac / lf;
}


// ------------------------------------------------------------------ long rows: folding O out of the MMA accumulators

// One thread's fold slot (kFoldKeys, FwdParams::fold): its element e at base[e * stride], stride = the block's
// folding threads, so a warp's accesses are coalesced. Elements: the thread's N accumulators of O, then the running
// max of each of its R rows at the last fold, then its R partial row sums.
// The loads and stores are volatile asm, kept in program order, so a fold never holds more than a few values in
// flight (plain loads would be hoisted together, and the registers for them would be reserved in the hot loop too).
struct FoldSlot {
  float* base;
  int stride;
  __device__ float get(int e) const {
    float x;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(x) : "l"(base + int64_t(e) * stride));
    return x;
  }
  __device__ void set(int e, float x) const {
    asm volatile("st.global.f32 [%0], %1;" ::"l"(base + int64_t(e) * stride), "f"(x) : "memory");
  }
};

// Moves O and the row sums (relative to the running max m, in score units; mult turns them into log2 units) into
// the slot and zeroes them: slot = slot * 2^((m_slot - m) * mult) + acc. first: the slot holds nothing yet. The
// thread's N accumulators of O and R rows are reached through o(i), m(r), l(r) (float&; constant indices once
// unrolled, so they stay registers); o(i) belongs to row (i / (2N / R)) * 2 + i % 4 / 2 (mma.sync and wgmma
// fragments alike: per m16 tile, c0 c1 on row g, c2 c3 on row g + 8).
template <int N, int R, class O, class M, class L>
__device__ __forceinline__ void fold_out(FoldSlot f, O&& o, M&& m, L&& l, float mult, bool first) {
  float c[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float m_use = m(r) == -INFINITY ? 0.f : m(r);  // as the softmax: nothing visible yet
    c[r] = first ? 0.f : fast_exp2((f.get(N + r) - m_use) * mult);
    f.set(N + R + r, first ? l(r) : fmaf(f.get(N + R + r), c[r], l(r)));
    f.set(N + r, m(r));
    l(r) = 0.f;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    f.set(i, first ? o(i) : fmaf(f.get(i), c[(i / (2 * N / R)) * 2 + i % 4 / 2], o(i)));
    o(i) = 0.f;
  }
}

// At the end of a row that folded: O and the sums get the slot's share back, rescaled to the final running max.
template <int N, int R, class O, class M, class L>
__device__ __forceinline__ void fold_in(FoldSlot f, O&& o, M&& m, L&& l, float mult) {
  float c[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float m_use = m(r) == -INFINITY ? 0.f : m(r);
    c[r] = fast_exp2((f.get(N + r) - m_use) * mult);
    l(r) = fmaf(f.get(N + R + r), c[r], l(r));
  }
#pragma unroll
  for (int i = 0; i < N; ++i) o(i) = fmaf(f.get(i), c[(i / (2 * N / R)) * 2 + i % 4 / 2], o(i));
}

}  // namespace flashlite::cuda_fwd
