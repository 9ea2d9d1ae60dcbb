#pragma once
// The fused forward kernel on tensor cores (FlashAttention-2 class), fp16 / bf16, sm_80 and newer.
//
// A block owns BR query rows of one head of one sequence; each warp owns 16 * MT of them. The block walks the key
// tiles its rows can see (KeyTiles: sink tiles, then the window / causal range), BC keys at a time, through a
// STAGES-deep cp.async pipeline of K and V tiles in shared memory. Per tile, per warp:
//   S = Q K^T       mma.sync m16n8k16, Q from registers (QREG) or shared memory, K by ldmatrix, fp32 accumulators
//   mask            only on tiles that are not fully visible (tile_fully_visible), with the shared predicate
//                   restated per row as key intervals (row_mask.h)
//   online softmax  in registers, log2 units (scale * log2 e folded in), one ex2 per score
//   O += P V        P re-packed from the S accumulators as the A operand, V by ldmatrix.trans
// At the end the sink logit joins the denominator, O is normalised, staged through shared memory and written
// once with 16-byte stores, and the LSE is written once.
// The CACHE variant (prefill) is the same kernel with K/V tiles read from a KV cache, through the page table when
// paged (load_kv_paged): a compile-time flag, so the forward() instantiations are unchanged.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/fwd_launch.h"
#include "cuda/fwd/row_mask.h"

namespace flashlite::cuda_fwd {

// Optional steps of the kernel (template bits so that the sweep can measure each one; production uses all).
inline constexpr int kFoldScale = 1;    // scale * log2(e) folded into exp2's FFMA, no separate multiply
inline constexpr int kSkipRescale = 2;  // O is not rescaled on tiles where no row of the warp raised its max
inline constexpr int kEarlyPack = 4;    // P packed to 16 bits right after the exponent (fewer live registers)
inline constexpr int kFeatAll = kFoldScale | kSkipRescale | kEarlyPack;

// TAG only makes otherwise equal configurations distinct types (bench/fwd instantiates its own copies).
template <int D_, int BR_, int BC_, int WARPS_, int STAGES_, bool QREG_, int FEAT_ = kFeatAll, int TAG_ = 0>
struct MmaTile {
  static constexpr int D = D_, BR = BR_, BC = BC_, WARPS = WARPS_, STAGES = STAGES_, FEAT = FEAT_;
  static constexpr bool QREG = QREG_;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int MT = BR / (16 * WARPS);  // m16 tiles per warp
  static constexpr int NT = BC / 8;             // n8 tiles of S
  static constexpr int KD = D / 16;             // k16 steps of Q K^T
  static constexpr int ND = D / 8;              // n8 tiles of O
  static constexpr int KB = BC / 16;            // k16 steps of P V
  static constexpr int LD = D + 8;              // smem row stride (elements): 16-byte pad, conflict-free ldmatrix
  static constexpr int CPR = D / 8;             // 16-byte chunks per row
  static constexpr int TILE_ELEMS = BC * LD;
  static constexpr int STAGE_ELEMS = 2 * TILE_ELEMS;  // K tile then V tile
  static constexpr int Q_ELEMS = BR * LD;
  // With Q held in registers, Q is staged in the last pipeline stage, which the prologue leaves free.
  static constexpr bool Q_ALIAS = QREG && Q_ELEMS <= STAGE_ELEMS && STAGES >= 2;
  static constexpr int SMEM_ELEMS = STAGES * STAGE_ELEMS + (Q_ALIAS ? 0 : Q_ELEMS);
  static constexpr int SMEM_BYTES = SMEM_ELEMS * 2;
  static_assert(BR % (16 * WARPS) == 0, "each warp owns whole m16 tiles");
  static_assert(BC % 16 == 0 && D % 16 == 0, "tiles are k16 multiples");
  static_assert(STAGES >= 2, "at least double buffering");
  static_assert(Q_ELEMS <= SMEM_ELEMS, "the output tile is staged in shared memory");
};

// The tile type of a configuration of FL_FWD_MMA_CONFIGS (the same type mma_f16.cu / mma_bf16.cu instantiate).
template <MmaConfig C>
using MmaTileOf = MmaTile<mma_config_info(C).head_dim, mma_config_info(C).block_rows, mma_config_info(C).block_keys,
                          mma_config_info(C).warps, mma_config_info(C).stages, mma_config_info(C).q_in_registers,
                          mma_config_info(C).feat>;

// Copies ROWS rows (relative to the tile start row0) of D elements from global memory to the shared tile at byte
// address s_dst; rows at or past `valid` are zero-filled (never read: they may belong to another sequence or hold
// NaN padding).
template <class Cfg, int ROWS, class T>
__device__ __forceinline__ void load_tile(uint32_t s_dst, const T* g, int64_t row_stride, int row0, int valid,
                                          bool vec) {
  constexpr int CPR = Cfg::CPR, LD = Cfg::LD;
  if constexpr (Cfg::THREADS % CPR == 0 && ROWS % (Cfg::THREADS / CPR) == 0) {
    // Each thread owns one 16-byte column chunk and every RSTEP-th row: addresses advance by constants.
    constexpr int RSTEP = Cfg::THREADS / CPR;
    const int r = int(threadIdx.x) / CPR, ch = int(threadIdx.x) % CPR;
    const T* src = g + int64_t(row0 + r) * row_stride + ch * 8;
    const int64_t step = int64_t(RSTEP) * row_stride;
    const uint32_t dst = s_dst + uint32_t((r * LD + ch * 8) * 2);
#pragma unroll
    for (int it = 0; it < ROWS / RSTEP; ++it) {
      load_chunk(dst + uint32_t(it * RSTEP * LD * 2), src, g, row0 + r + it * RSTEP < valid, vec);
      src += step;
    }
  } else {  // e.g. D = 96: 12 chunks per row
    constexpr int CHUNKS = ROWS * CPR;
#pragma unroll
    for (int it = 0; it < (CHUNKS + Cfg::THREADS - 1) / Cfg::THREADS; ++it) {
      const int c = int(threadIdx.x) + it * Cfg::THREADS;
      if (CHUNKS % Cfg::THREADS != 0 && c >= CHUNKS) break;
      const int r = c / CPR, ch = c % CPR;
      load_chunk(s_dst + uint32_t((r * LD + ch * 8) * 2), g + int64_t(row0 + r) * row_stride + ch * 8, g,
                 row0 + r < valid, vec);
    }
  }
}

// The K and V tiles of keys [row0, row0 + ROWS) of one sequence of a paged cache: key j lives in page
// pages[j / page_size] at slot j % page_size; kg / vg point at the head's first element of page 0, the strides' batch
// fields are the page strides. A tile may span pages. A thread owns one 16-byte column chunk of every RSTEP-th row;
// RSTEP <= 16 <= page_size, so its next row is RSTEP slots on with at most one page step (one division per tile, not
// per row). The page ids are read first (independent loads, one latency per tile), then the copies are issued; K and
// V share them. Keys at or past `valid` are zero-filled.
template <class Cfg, int ROWS, class T>
__device__ __forceinline__ void load_kv_paged(uint32_t s_k, uint32_t s_v, const T* kg, const T* vg, const FwdParams& p,
                                              const int* pages, int row0, int valid) {
  constexpr int CPR = Cfg::CPR, LD = Cfg::LD, RSTEP = Cfg::THREADS / CPR, N = ROWS / RSTEP;
  static_assert(Cfg::THREADS % CPR == 0 && ROWS % RSTEP == 0 && RSTEP <= 16, "a KV-cache tile: whole rows per pass");
  const int r = int(threadIdx.x) / CPR, ch = int(threadIdx.x) % CPR, ps = p.page_size;
  const int j = row0 + r;
  const int e0 = j / ps, s0 = j - e0 * ps;
  int page[N];
  {
    int e = e0, s = s0;
#pragma unroll
    for (int it = 0; it < N; ++it) {
      page[it] = j + it * RSTEP < valid ? __ldg(pages + e) : 0;
      s += RSTEP;
      if (s >= ps) s -= ps, ++e;
    }
  }
  // Strides fit in 32 bits (checked on the host): one wide multiply-add per offset.
  const int ksb = int(p.k_stride.batch), kss = int(p.k_stride.seq);
  const int vsb = int(p.v_stride.batch), vss = int(p.v_stride.seq);
  const T* kc = kg + ch * 8;
  const T* vc = vg + ch * 8;
  const uint32_t dst = uint32_t((r * LD + ch * 8) * 2);
  int s = s0;
#pragma unroll
  for (int it = 0; it < N; ++it) {
    const bool ok = j + it * RSTEP < valid;
    const uint32_t d = dst + uint32_t(it * RSTEP * LD * 2);
    load_chunk(s_k + d, kc + (int64_t(page[it]) * ksb + int64_t(s) * kss), kg, ok, p.vec_in);
    load_chunk(s_v + d, vc + (int64_t(page[it]) * vsb + int64_t(s) * vss), vg, ok, p.vec_in);
    s += RSTEP;
    if (s >= ps) s -= ps;
  }
}

// CACHE = false: attention over k / v tensors (forward()). CACHE = true: prefill, K/V read from a KV cache
// (contiguous or paged, FwdParams::paged), lengths from the cache's device index; otherwise the same kernel.
template <class T, class Cfg, bool CACHE = false>
__global__ void __launch_bounds__(Cfg::THREADS, 1) fwd_mma_kernel(const __grid_constant__ FwdParams p) {
  constexpr int BR = Cfg::BR, BC = Cfg::BC, MT = Cfg::MT, NT = Cfg::NT, KD = Cfg::KD, ND = Cfg::ND,
                KB = Cfg::KB, LD = Cfg::LD, STAGES = Cfg::STAGES;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  BlockWork w;
  if (!decode_block<CACHE>(p, BR, w, int(blockIdx.x))) return;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group, thread in group
  const int sq = w.sq, sk = w.sk;
  const int i0 = w.tile * BR;
  const int i1 = min(i0 + BR, sq);
  const KeyTiles kt = key_tiles(p.mask, i0, i1, sq, sk, BC);

  const int kvh = w.head / p.group;
  const T* qg = static_cast<const T*>(p.q) + w.tb * p.q_stride.batch + w.q_row0 * p.q_stride.seq +
      w.head * p.q_stride.head;
  // K/V: tensors at (tb, k_row0); a contiguous cache at its sequence; a paged cache at page 0 (pages added per row).
  const int64_t kb = CACHE ? (p.paged ? 0 : w.seq) : w.tb;
  const T* kg = static_cast<const T*>(p.k) + kb * p.k_stride.batch + w.k_row0 * p.k_stride.seq + kvh * p.k_stride.head;
  const T* vg = static_cast<const T*>(p.v) + kb * p.v_stride.batch + w.k_row0 * p.v_stride.seq + kvh * p.v_stride.head;
  const int* pages = CACHE && p.paged ? p.indices + p.indptr[w.seq] : nullptr;

  // Shared memory as 32-bit addresses (bytes): [stage][K tile | V tile], then Q unless it aliases the last stage.
  constexpr uint32_t STAGE_BYTES = Cfg::STAGE_ELEMS * 2, TILE_BYTES = Cfg::TILE_ELEMS * 2;
  const uint32_t s_base = smem_addr(smem_raw);
  const uint32_t sQ = s_base + (Cfg::Q_ALIAS ? (STAGES - 1) : STAGES) * STAGE_BYTES;
  auto issue_kv = [&](int n) {
    const uint32_t st = s_base + uint32_t(n % STAGES) * STAGE_BYTES;
    const int j0 = kt.tile(n) * BC;
    if constexpr (CACHE) {
      if (p.paged) {
        load_kv_paged<Cfg, BC>(st, st + TILE_BYTES, kg, vg, p, pages, j0, sk);
        return;
      }
    }
    load_tile<Cfg, BC>(st, kg, p.k_stride.seq, j0, sk, p.vec_in);
    load_tile<Cfg, BC>(st + TILE_BYTES, vg, p.v_stride.seq, j0, sk, p.vec_in);
  };

  // Prologue: Q, then the first STAGES - 1 key tiles, one commit group each.
  load_tile<Cfg, BR>(sQ, qg, p.q_stride.seq, i0, sq, p.vec_in);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < kt.count) issue_kv(s);
    cp_async_commit();
  }

  const int wrow0 = warp * MT * 16;  // first row of this warp within the tile
  // Per-lane ldmatrix row addresses (see the PTX fragment layouts of m16n8k16); the tile offsets are constants.
  //   Q (A operand, x4 = a0..a3): rows (lane/8 % 2)*8 + lane%8, columns (lane/16)*8
  //   K (B = K^T, two n8 tiles):  keys (lane/16)*8 + lane%8,   columns (lane/8 % 2)*8
  //   V (B = V, .trans, two n8):  keys (lane/8 % 2)*8 + lane%8, columns (lane/16)*8
  const uint32_t q_lane = sQ + uint32_t(((wrow0 + (lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8) * 2);
  const uint32_t k_lane = uint32_t((((lane / 16) * 8 + lane % 8) * LD + (lane / 8 % 2) * 8) * 2);
  const uint32_t v_lane = TILE_BYTES + uint32_t((((lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8) * 2);

  uint32_t qreg[Cfg::QREG ? MT : 1][Cfg::QREG ? KD : 1][4];
  if constexpr (Cfg::QREG) {
    cp_async_wait<STAGES - 1>();
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) ldmatrix_x4(qreg[mi][kk], q_lane + uint32_t((mi * 16 * LD + kk * 16) * 2));
    // The loop's first barrier orders these reads before the last stage (which may alias sQ) is overwritten.
  }

  float o[MT][ND][4];
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int dn = 0; dn < ND; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][dn][e] = 0.f;
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
    l_run[mi][0] = l_run[mi][1] = 0.f;
  }

  // Long rows: this thread's fold slot and its accumulators as the fold helpers reach them (kFoldKeys).
  constexpr int FOLD_TILES = kFoldKeys / BC, FOLD_N = MT * ND * 4, FOLD_R = MT * 2;
  const auto fold_slot = [&] {
    return FoldSlot{p.fold + blockIdx.x * fold_floats_per_block(BR, Cfg::D) + threadIdx.x, Cfg::THREADS};
  };
  const auto o_at = [&](int i) -> float& { return o[i / (ND * 4)][i / 4 % ND][i % 4]; };
  const auto m_at = [&](int r) -> float& { return m_run[r / 2][r % 2]; };
  const auto l_at = [&](int r) -> float& { return l_run[r / 2][r % 2]; };

  // Rows of this warp that exist; a warp wholly past the sequence end computes on zeros and writes nothing.
  const int wr0 = i0 + wrow0, wr1 = min(wr0 + MT * 16, sq);

  // Scale folded into the exponent unless a softcap (or a non-positive scale) needs the scores transformed first.
  const bool transform = !(Cfg::FEAT & kFoldScale) || p.softcap || !(p.scale_log2 > 0.f);
  const float mult = transform ? 1.f : p.scale_log2;

  // Long rows: the key tiles in segments of FOLD_TILES, and between segments O and the sums leave the MMA
  // accumulators (kFoldKeys). A fold inside the tile loop would cost registers there (ptxas -v: up to +20).
  for (int n0 = 0; n0 < kt.count; n0 += FOLD_TILES) {
    if (n0 > 0 && p.fold != nullptr) fold_out<FOLD_N, FOLD_R>(fold_slot(), o_at, m_at, l_at, mult, n0 == FOLD_TILES);
    const int n1 = min(kt.count, n0 + FOLD_TILES);
    for (int n = n0; n < n1; ++n) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile n is in shared memory for everyone; tile n - 1's stage is free
      if (n + STAGES - 1 < kt.count) issue_kv(n + STAGES - 1);
      cp_async_commit();

      const int st = n % STAGES;
      const int j0 = kt.tile(n) * BC;
      const uint32_t stage = s_base + uint32_t(st) * STAGE_BYTES;

      // S = Q K^T (raw dot products, fp32).
      float s[MT][NT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int nj = 0; nj < NT; ++nj)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][nj][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          if constexpr (Cfg::QREG) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[mi][e] = qreg[mi][kk][e];
          } else {
            ldmatrix_x4(qa[mi], q_lane + uint32_t((mi * 16 * LD + kk * 16) * 2));
          }
        }
#pragma unroll
        for (int nj = 0; nj < NT; nj += 2) {
          uint32_t kb[4];
          ldmatrix_x4(kb, stage + k_lane + uint32_t((nj * 8 * LD + kk * 16) * 2));
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            mma_16816<T>(s[mi][nj], qa[mi], kb[0], kb[1]);
            mma_16816<T>(s[mi][nj + 1], qa[mi], kb[2], kb[3]);
          }
        }
      }

      // Scores: a softcap (or a non-positive scale) turns them into log2 units here; otherwise the scale * log2(e)
      // is folded into the exponent below (kFoldScale: one FFMA per score).
      if (transform) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int nj = 0; nj < NT; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float x = s[mi][nj][e];
              s[mi][nj][e] = p.softcap ? p.softcap_post * accurate_tanh(x * p.softcap_pre) : x * p.scale_log2;
            }
      }
      // The mask, on boundary tiles only.
      const bool full = wr0 >= sq || (j0 + BC <= sk && tile_fully_visible(p.mask, wr0, wr1, j0, j0 + BC, sq, sk));
      if (!full) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            // Row interval form of the shared predicate (row_mask.h); 32-bit compares against tile-relative keys.
            const RowKeys rk = row_keys(p.mask, wr0 + mi * 16 + g + r * 8, sq, sk);
            const int lo = clamp_to(rk.lo - j0, -1, BC), hi = clamp_to(rk.hi - j0, -1, BC);
            const int se = clamp_to(rk.sink_end - j0, 0, BC);
#pragma unroll
            for (int nj = 0; nj < NT; ++nj)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = nj * 8 + 2 * t + e;
                if (!((j >= lo && j <= hi) || j < se)) s[mi][nj][2 * r + e] = -INFINITY;
              }
          }
      }

      // Online softmax: each quad of lanes shares a row; sums stay per-thread until the end. m_run is in score
      // units (log2 units times 1 / mult).
      uint32_t pk[MT][NT][2];  // kEarlyPack: P as 16-bit pairs right after the exponent (frees the fp32 scores)
      bool raised = false;     // some row of this thread raised a running max that was finite
      float alpha[MT][2];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) mx = fmaxf(mx, fmaxf(s[mi][nj][2 * r], s[mi][nj][2 * r + 1]));
          mx = quad_max(mx);
          const float m_old = m_run[mi][r];
          const float m_new = fmaxf(m_old, mx);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid -inf - -inf
          alpha[mi][r] = fast_exp2((m_old - m_use) * mult);
          raised |= m_new > m_old && m_old > -INFINITY;  // else O is still zero or unchanged
          m_run[mi][r] = m_new;
          const float neg = -m_use * mult;
          float sum = 0.f;
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) {
            const float p0 = fast_exp2(fmaf(s[mi][nj][2 * r], mult, neg));
            const float p1 = fast_exp2(fmaf(s[mi][nj][2 * r + 1], mult, neg));
            sum += p0 + p1;
            if constexpr (Cfg::FEAT & kEarlyPack) {
              pk[mi][nj][r] = pack2<T>(p0, p1);
            } else {
              s[mi][nj][2 * r] = p0;
              s[mi][nj][2 * r + 1] = p1;
            }
          }
          l_run[mi][r] = l_run[mi][r] * alpha[mi][r] + sum;
        }
      // Rescale O; kSkipRescale: not at all when no row of the warp raised its max (most tiles of long rows).
      if (!(Cfg::FEAT & kSkipRescale) || __any_sync(0xffffffffu, raised)) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int dn = 0; dn < ND; ++dn) {
            o[mi][dn][0] *= alpha[mi][0];
            o[mi][dn][1] *= alpha[mi][0];
            o[mi][dn][2] *= alpha[mi][1];
            o[mi][dn][3] *= alpha[mi][1];
          }
      }

      // O += P V: the S accumulators of two n8 tiles form one k16 A fragment.
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          if constexpr (Cfg::FEAT & kEarlyPack) {
            pa[mi][0] = pk[mi][2 * kb][0];
            pa[mi][1] = pk[mi][2 * kb][1];
            pa[mi][2] = pk[mi][2 * kb + 1][0];
            pa[mi][3] = pk[mi][2 * kb + 1][1];
          } else {
            pa[mi][0] = pack2<T>(s[mi][2 * kb][0], s[mi][2 * kb][1]);
            pa[mi][1] = pack2<T>(s[mi][2 * kb][2], s[mi][2 * kb][3]);
            pa[mi][2] = pack2<T>(s[mi][2 * kb + 1][0], s[mi][2 * kb + 1][1]);
            pa[mi][3] = pack2<T>(s[mi][2 * kb + 1][2], s[mi][2 * kb + 1][3]);
          }
        }
#pragma unroll
        for (int dn = 0; dn < ND; dn += 2) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, stage + v_lane + uint32_t((kb * 16 * LD + dn * 8) * 2));
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            mma_16816<T>(o[mi][dn], pa[mi], vb[0], vb[1]);
            mma_16816<T>(o[mi][dn + 1], pa[mi], vb[2], vb[3]);
          }
        }
      }
    }
  }
  if (p.fold != nullptr && kt.count > FOLD_TILES) fold_in<FOLD_N, FOLD_R>(fold_slot(), o_at, m_at, l_at, mult);

  // Epilogue: normalise (the sink logit joins the denominator), stage O in shared memory, write it once.
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers
  const float sink2 = p.sink_logits ? p.sink_logits[w.head] * kLog2e : -INFINITY;
  T* sO = smem;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lse;
      const float f = finish_row(m_run[mi][r] * mult, quad_sum(l_run[mi][r]), sink2, lse);
      const int row = wrow0 + mi * 16 + g + r * 8;  // within the tile
#pragma unroll
      for (int dn = 0; dn < ND; ++dn) {
        *reinterpret_cast<uint32_t*>(sO + row * LD + dn * 8 + 2 * t) =
            pack2<T>(o[mi][dn][2 * r] * f, o[mi][dn][2 * r + 1] * f);
      }
      if (p.lse && t == 0 && i0 + row < sq) {
        p.lse[w.tb * p.lse_stride.batch + w.head * p.lse_stride.head + (w.q_row0 + i0 + row) * p.lse_stride.seq] = lse;
      }
    }
  __syncthreads();
  T* og = static_cast<T*>(p.out) + w.tb * p.out_stride.batch + w.q_row0 * p.out_stride.seq + w.head * p.out_stride.head;
  constexpr int CHUNKS = BR * Cfg::CPR;
#pragma unroll
  for (int it = 0; it < (CHUNKS + Cfg::THREADS - 1) / Cfg::THREADS; ++it) {
    const int c = int(threadIdx.x) + it * Cfg::THREADS;
    if (CHUNKS % Cfg::THREADS != 0 && c >= CHUNKS) break;
    const int r = c / Cfg::CPR, ch = c % Cfg::CPR;
    if (i0 + r >= sq) continue;
    const uint4 val = *reinterpret_cast<const uint4*>(sO + r * LD + ch * 8);
    T* dst = og + int64_t(i0 + r) * p.out_stride.seq + ch * 8;
    if (p.vec_out) {
      *reinterpret_cast<uint4*>(dst) = val;
    } else {
      const unsigned short* h = reinterpret_cast<const unsigned short*>(&val);
#pragma unroll
      for (int e = 0; e < 8; ++e) reinterpret_cast<unsigned short*>(dst)[e] = h[e];
    }
  }
}

// Launches one instantiation. grid: one block per (query tile, sequence, head).
template <class T, class Cfg, bool CACHE = false>
void launch_fwd_mma(const FwdParams& p, cudaStream_t stream) {
  static cuda::PerContextFlag configured;
  if constexpr (Cfg::SMEM_BYTES > 48 * 1024) {
    ensure_smem_optin(fwd_mma_kernel<T, Cfg, CACHE>, Cfg::SMEM_BYTES, configured);
  }
  const int64_t blocks = int64_t(p.q_tiles) * p.q_heads * p.batch;
  fwd_mma_kernel<T, Cfg, CACHE><<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(p);
}

}  // namespace flashlite::cuda_fwd
