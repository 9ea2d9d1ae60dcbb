#pragma once
// Split-KV decode kernel (flash-decoding) with GQA packing, fp16 / bf16, contiguous or paged cache, sm_80+.
//
// Block (split s, kv head h x row chunk, sequence b), 4 warps. Its rows are the GQA group of h times the q_len new
// tokens (row r = (position r / group, head r % group)), so all q heads of a KV head share one pass over its K/V.
// The keys the rows can see (sink tokens, then the window / causal range: at most two intervals, concatenated into
// a "virtual" key range) are cut into 64-key tiles, and split s takes an even share of the tiles. Tiles stream
// through a 3-stage cp.async pipeline of 16-byte copies, three tiles in flight while one is waited for (row
// addresses per key; the paged layout's per-row page ids are copied into shared memory three tiles ahead, with the
// K/V copies); per warp and 16 keys:
//   S = Q K^T      mma.sync m16n8k16, Q fragments in registers, K by ldmatrix
//   mask           only on tiles that are not fully visible (shared predicate, common/mask.h)
//   online softmax in registers, log2 units
//   O += P V       P re-packed from the S accumulators, V by ldmatrix.trans
// Warps split the rows (16 each) and the keys of a tile (4 / row-warps ways); their partial states merge in shared
// memory at the end. With one split the block writes out / lse (sink logit joining the denominator); otherwise a
// normalised partial O and its LSE, merged by the combine kernel (combine.cuh) or, when the splits are the CTAs of
// one cluster (sm_90), in distributed shared memory by the CTAs themselves (cluster_merge.cuh).
#include <cuda_runtime.h>

#include "common/paged.h"
#include "cuda/decode/cluster_merge.cuh"
#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_ptx.cuh"

namespace flashlite::cuda_decode {

// Diagnostic timeline (decode_params.h): stamp k of this block, from thread 0. Compiled out by default.
#if FLASHLITE_DECODE_TIMELINE
// dep: a value the stamp waits for (the timer is read only once it has arrived).
__device__ __forceinline__ void timeline_stamp(const DecodeParams& p, int k, int dep = 0) {
  if (p.timeline == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep));
  const unsigned long long block = (uint64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  p.timeline[block * kTimelineStamps + k] = t;
  if (k == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    p.timeline[block * kTimelineStamps + 8] = smid + 1;  // 0 = no block
  }
}
#else
__device__ __forceinline__ void timeline_stamp(const DecodeParams&, int, int = 0) {}
#endif

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kTileKeys = 64;
inline constexpr int kStages = 3;
inline constexpr int kRowsPerBlock = 64;
inline constexpr int kPidRing = 8;   // tiles of page ids in shared memory (written 3 tiles ahead of use: >= 4 needed)
inline constexpr int kPidAhead = kStages;  // the page ids of tile t travel in tile t - 3's commit group

template <int D>
struct SplitCfg {
  static constexpr int LD = D + 8;  // shared row stride (elements): a 16-byte pad makes ldmatrix conflict-free
  static constexpr int CPR = D / 8;  // 16-byte chunks per row
  static constexpr int TILE_BYTES = kTileKeys * LD * 2;
  static constexpr int STAGE_BYTES = 2 * TILE_BYTES;  // K tile, V tile
  static constexpr int PIPE_BYTES = kStages * STAGE_BYTES;
  // Paged: the page id of every key row of a tile, copied (cp.async) three tiles before the tile is issued; a ring of
  // kPidRing tiles after the pipeline buffers.
  static constexpr int PID_BYTES = kPidRing * kTileKeys * 4;
  static constexpr int SMEM_BYTES = PIPE_BYTES + PID_BYTES;
  static constexpr int KD = D / 16;  // k16 steps of Q K^T
  static constexpr int ND = D / 8;   // n8 tiles of O
  static constexpr int ROWS_PER_PASS = kThreads / CPR;
  static constexpr int PASSES = kTileKeys / ROWS_PER_PASS;
  // End-of-block merge: per warp its O fragments (ND * 4 floats x 32 lanes) and m, l of its 16 rows.
  static constexpr int MERGE_FLOATS = ND * 4 * 32 + 32;
  static_assert(kThreads % CPR == 0 && kTileKeys % ROWS_PER_PASS == 0, "whole rows per load pass");
  static_assert(kRowsPerBlock * LD * 2 <= TILE_BYTES, "Q is staged in the last stage's K tile");
  static_assert(kWarps * MERGE_FLOATS * 4 <= PIPE_BYTES, "the merge area fits in the pipeline buffers");
  // Cluster merge (cluster_merge.cuh): this CTA's normalised partial rows and LSEs, after the merge area.
  static constexpr int CLUSTER_O_OFF = kWarps * MERGE_FLOATS * 4;
  static constexpr int CLUSTER_LSE_OFF = CLUSTER_O_OFF + kRowsPerBlock * D * 4;
  static_assert(CLUSTER_O_OFF % 16 == 0 && CLUSTER_LSE_OFF + kRowsPerBlock * 4 <= PIPE_BYTES, "cluster area fits");
  static_assert(kPidRing > kPidAhead + 1 && kTileKeys <= kThreads, "page-id ring: one row per copying thread");
};

// The keys a sequence's rows can see as one virtual range [0, n_total): [0, n1) then [start2, start2 + n2).
struct VirtualKeys {
  int n1, start2, n_total;
  __device__ __forceinline__ int pos(int vk) const { return vk < n1 ? vk : start2 + (vk - n1); }
};

__device__ __forceinline__ VirtualKeys virtual_keys(const MaskParams& m, int q_len, int L) {
  const KeyRange w = window_key_range(m, 0, q_len, q_len, L);
  int64_t sink_end = m.sink_tokens;
  const int64_t ce = causal_key_end(m, q_len, q_len, L);
  if (ce < sink_end) sink_end = ce;
  if (L < sink_end) sink_end = L;
  VirtualKeys v;
  const int wlen = int(w.end > w.begin ? w.end - w.begin : 0);
  if (sink_end <= 0) {
    v.n1 = 0, v.start2 = int(w.begin), v.n_total = wlen;
  } else if (sink_end >= w.begin) {  // sinks and window touch: one interval from 0
    v.n1 = 0, v.start2 = 0, v.n_total = int(w.end > sink_end ? w.end : sink_end);
  } else {
    v.n1 = int(sink_end), v.start2 = int(w.begin), v.n_total = int(sink_end) + wlen;
  }
  return v;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) decode_split_kernel(const __grid_constant__ DecodeParams p) {
  using Cfg = SplitCfg<D>;
  constexpr int LD = Cfg::LD, CPR = Cfg::CPR, KD = Cfg::KD, ND = Cfg::ND;
  extern __shared__ __align__(128) unsigned char smem[];
  timeline_stamp(p, 0);
  // The dependents (the combine kernel, or the next kernel of a caller's chain) are let launch only once this
  // block's first tile has landed (below): a dependent that starts streaming its own inputs (an engine's next GEMV
  // preloads megabytes of weights) would otherwise queue this kernel's few latency-bound loads behind its traffic
  // (measured with the engine timeline: q and the first tile took ~4 us after the wait).
  pdl_wait();       // launched as a programmatic dependent: q and the cache may be the previous kernel's output
  timeline_stamp(p, 1);

  const int split = int(blockIdx.x);
  const int kvh = int(blockIdx.y) % p.kv_heads, rc = int(blockIdx.y) / p.kv_heads;
  const int b = int(blockIdx.z);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates

  // Rows of this block, and the warp grid: wm_count row tiles x wn_count key groups.
  const int r_base = rc * kRowsPerBlock;
  const int r_blk = min(kRowsPerBlock, p.rows - r_base);
  const int wm_count = r_blk <= 16 ? 1 : r_blk <= 32 ? 2 : 4;
  const int wn_count = kWarps / wm_count;
  const int wm = warp / wn_count, wn = warp % wn_count;
  const int keys_per_warp = kTileKeys / wn_count;

  const uint32_t s_base = smem_addr(smem);
  const uint32_t sQ = s_base + uint32_t((kStages - 1) * Cfg::STAGE_BYTES);
  // Q rows (zeros past the block's rows) into the last stage's K tile, as its own commit group; issued before the
  // length is read so the two memory round trips overlap.
  {
    const T* qg = static_cast<const T*>(p.q);
    const int q_rows = wm_count * 16;
    for (int c = tid; c < q_rows * CPR; c += kThreads) {
      const int r = c / CPR, ch = c % CPR;
      const uint32_t dst = sQ + uint32_t((r * LD + ch * 8) * 2);
      const bool ok = r < r_blk;
      const T* src = qg;
      if (ok) {
        const int gr = r_base + r;
        const int i = gr / p.group, head = kvh * p.group + gr % p.group;
        src = qg + p.q_stride.offset(b, i, head) + ch * 8;
      }
      load_chunk(dst, src, src, ok, p.q_vec);  // src stays the base pointer when !ok
    }
  }

  // Sequence length and the keys to visit.
  int L, page_base = 0;
  if (p.paged) {
    page_base = p.indptr[b];
    const int pages = p.indptr[b + 1] - page_base;
    // The paged-length rule of src/common/paged.h written out: the call form costs this kernel 3 registers' worth of
    // different code (215 -> 212), which would need an H100 timing before it ships.
    L = pages == 0 ? 0 : (pages - 1) * p.page_size + p.last_page_len[b];
  } else {
    L = p.seq_lens[b];
  }
  const VirtualKeys vkeys = virtual_keys(p.mask, p.q_len, L);
  const int total_tiles = (vkeys.n_total + kTileKeys - 1) / kTileKeys;
  const int per_split = (total_tiles + p.num_splits - 1) / p.num_splits;
  const int t_begin = split * per_split;
  const int n_tiles = max(0, min(t_begin + per_split, total_tiles) - t_begin);
  timeline_stamp(p, 7, n_tiles);  // the length arrived

  // Row addresses: this thread's 16-byte chunk of head kvh; the contiguous layout adds b's stride here once.
  const int ch = tid % CPR;
  const int64_t seq_k = p.paged ? 0 : int64_t(b) * p.k_stride.batch, seq_v = p.paged ? 0 : int64_t(b) * p.v_stride.batch;
  const T* kbase = static_cast<const T*>(p.k) + seq_k + int64_t(kvh) * p.k_stride.head + ch * 8;
  const T* vbase = static_cast<const T*>(p.v) + seq_v + int64_t(kvh) * p.v_stride.head + ch * 8;
  const int page_mask = p.page_shift >= 0 ? p.page_size - 1 : 0;

  // Paged: page ids of tile t's 64 rows into the shared ring (threads < 64, one row each), as part of tile
  // t - kPidAhead's copies: they have landed before tile t is issued, so the copies never wait on a page-table load
  // (a plain load issued behind a tile's worth of copies returns only after them).
  int* const pid = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES);  // (kPidRing, kTileKeys)
  auto copy_pids = [&](int t) {
    if (!p.paged || tid >= kTileKeys) return;
    const int vk = (t_begin + t) * kTileKeys + tid;
    const uint32_t dst = smem_addr(pid + (t % kPidRing) * kTileKeys + tid);
    if (t < n_tiles && vk < vkeys.n_total) {
      const int pos = vkeys.pos(vk);
      const int page_idx = p.page_shift >= 0 ? pos >> p.page_shift : pos / p.page_size;
      cp_async_4(dst, p.indices + page_base + page_idx);
    } else {
      st_shared_4(dst, 0u);
    }
  };
#pragma unroll
  for (int t = 0; t < kPidAhead; ++t) copy_pids(t);
  cp_async_commit();  // group: Q rows and the first tiles' page ids
  if (p.paged) {
    cp_async_wait<0>();
    __syncthreads();
  }

  const uint64_t kv_policy = l2_evict_first_policy();
  // One tile (n-th of this split) into its stage: 64 rows of K and V, 16-byte copies; keys past the range are zeros.
  auto issue = [&](int n) {
    const uint32_t sK = s_base + uint32_t((n % kStages) * Cfg::STAGE_BYTES);
    const uint32_t sV = sK + Cfg::TILE_BYTES;
    const int vk0 = (t_begin + n) * kTileKeys;
    const int* pid_n = pid + (n % kPidRing) * kTileKeys;
#pragma unroll
    for (int pass = 0; pass < Cfg::PASSES; ++pass) {
      const int row = tid / CPR + pass * Cfg::ROWS_PER_PASS;
      const int vk = vk0 + row;
      const bool ok = vk < vkeys.n_total;
      const T* ksrc = kbase;
      const T* vsrc = vbase;
      if (ok) {
        const int pos = vkeys.pos(vk);
        if (p.paged) {
          const int64_t page = pid_n[row];
          const int slot = p.page_shift >= 0 ? (pos & page_mask) : pos % p.page_size;
          ksrc += page * p.k_stride.batch + int64_t(slot) * p.k_stride.seq;
          vsrc += page * p.v_stride.batch + int64_t(slot) * p.v_stride.seq;
        } else {
          ksrc += int64_t(pos) * p.k_stride.seq;
          vsrc += int64_t(pos) * p.v_stride.seq;
        }
      }
      const uint32_t off = uint32_t((row * LD + ch * 8) * 2);
      if (p.kv_evict_first) {
        if constexpr (D == 128) {
          cp_async_16_l2_256_policy(sK + off, ksrc, ok ? 16 : 0, kv_policy);
          cp_async_16_l2_256_policy(sV + off, vsrc, ok ? 16 : 0, kv_policy);
        } else {
          cp_async_16_policy(sK + off, ksrc, ok ? 16 : 0, kv_policy);
          cp_async_16_policy(sV + off, vsrc, ok ? 16 : 0, kv_policy);
        }
      } else if constexpr (D == 128) {
        cp_async_16_l2_256(sK + off, ksrc, ok ? 16 : 0);
        cp_async_16_l2_256(sV + off, vsrc, ok ? 16 : 0);
      } else {
        cp_async_16(sK + off, ksrc, ok ? 16 : 0);
        cp_async_16(sV + off, vsrc, ok ? 16 : 0);
      }
    }
    copy_pids(n + kPidAhead);
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) issue(s);
    cp_async_commit();
  }

  // Q fragments (A operand) of this warp's 16 rows.
  uint32_t qf[KD][4];
  cp_async_wait<kStages - 1>();
  __syncthreads();
  timeline_stamp(p, 2);  // q (and the length) landed, the first tiles issued
  {
    const uint32_t q_lane = sQ + uint32_t(((wm * 16 + (lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8) * 2);
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) ldmatrix_x4(qf[kk], q_lane + uint32_t(kk * 16 * 2));
  }
  // (The loop's first barrier orders these reads before the last stage is overwritten.)

  float o[ND][4];
#pragma unroll
  for (int dn = 0; dn < ND; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // The q position of each of this thread's two rows (padding rows take the last position: harmless).
  int row_i[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = r_base + wm * 16 + g + 8 * h;
    row_i[h] = gr < p.rows ? gr / p.group : p.q_len - 1;
  }
  const bool capped = p.softcap > 0.f;

  // Per-lane ldmatrix offsets within a tile (bytes): K as B = K^T (two n8 tiles), V as B with .trans (two n8 tiles).
  const uint32_t k_lane = uint32_t((((lane / 16) * 8 + lane % 8) * LD + (lane / 8 % 2) * 8) * 2);
  const uint32_t v_lane = uint32_t(Cfg::TILE_BYTES + (((lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8) * 2);

  if (n_tiles == 0) pdl_launch_dependents();
  for (int n = 0; n < n_tiles; ++n) {
    // Tile n + 2 goes out before waiting for tile n, so three tiles are in flight during the wait.
    __syncthreads();  // every warp is done with tile n - 1: its stage is free
    if (n + kStages - 1 < n_tiles) issue(n + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();  // tile n is in shared memory for all
    if (n == 0) {
      timeline_stamp(p, 3);
      pdl_launch_dependents();
    }

    const uint32_t stage = s_base + uint32_t((n % kStages) * Cfg::STAGE_BYTES);
    const int vt0 = (t_begin + n) * kTileKeys;
    // Fully visible tile: inside the range, within one interval, and the predicate true for every (row, key).
    bool full = vt0 + kTileKeys <= vkeys.n_total && (vt0 + kTileKeys <= vkeys.n1 || vt0 >= vkeys.n1);
    if (full) {
      const int j0 = vkeys.pos(vt0);
      full = tile_fully_visible(p.mask, 0, p.q_len, j0, j0 + kTileKeys, p.q_len, L);
    }

    for (int key0 = wn * keys_per_warp; key0 < (wn + 1) * keys_per_warp; key0 += 16) {
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const uint32_t k_addr = stage + k_lane + uint32_t(key0 * LD * 2);
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_addr + uint32_t(kk * 16 * 2));
        mma_16816<T>(s[0], qf[kk], kf[0], kf[1]);
        mma_16816<T>(s[1], qf[kk], kf[2], kf[3]);
      }
      // Scores in log2 units; masked ones -inf.
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = capped ? p.softcap * tanhf(s[nt][e] * p.scale / p.softcap) * kLog2e : s[nt][e] * p.scale_log2;
          if (!full) {
            const int vk = vt0 + key0 + nt * 8 + 2 * t4 + (e & 1);
            if (vk >= vkeys.n_total || !key_visible(p.mask, row_i[e >> 1], vkeys.pos(vk), p.q_len, L)) x = -INFINITY;
          }
          s[nt][e] = x;
        }
      }
      // Online softmax, two rows per thread (h = 0: row g, h = 1: row g + 8).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
        mx = quad_max(mx);
        const float m_new = fmaxf(m_run[h], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = fast_exp2(m_run[h] - m_use);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          s[nt][2 * h] = fast_exp2(s[nt][2 * h] - m_use);
          s[nt][2 * h + 1] = fast_exp2(s[nt][2 * h + 1] - m_use);
          sum += s[nt][2 * h] + s[nt][2 * h + 1];
        }
        l_run[h] = l_run[h] * alpha + sum;
        m_run[h] = m_new;
#pragma unroll
        for (int dn = 0; dn < ND; ++dn) {
          o[dn][2 * h] *= alpha;
          o[dn][2 * h + 1] *= alpha;
        }
      }
      // O += P V.
      uint32_t pa[4];
      pa[0] = pack2<T>(s[0][0], s[0][1]);
      pa[1] = pack2<T>(s[0][2], s[0][3]);
      pa[2] = pack2<T>(s[1][0], s[1][1]);
      pa[3] = pack2<T>(s[1][2], s[1][3]);
      const uint32_t v_addr = stage + v_lane + uint32_t(key0 * LD * 2);
#pragma unroll
      for (int dp = 0; dp < ND / 2; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_addr + uint32_t(dp * 16 * 2));
        mma_16816<T>(o[2 * dp], pa, vf[0], vf[1]);
        mma_16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: they become the merge area
  timeline_stamp(p, 4);

  l_run[0] = quad_sum(l_run[0]);
  l_run[1] = quad_sum(l_run[1]);

  // Merge the key groups of each row tile into the warp with wn == 0.
  if (wn_count > 1) {
    float* area = reinterpret_cast<float*>(smem);
    float* mine = area + warp * Cfg::MERGE_FLOATS;
#pragma unroll
    for (int dn = 0; dn < ND; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(dn * 4 + e) * 32 + lane] = o[dn][e];
    if (t4 == 0) {
      mine[ND * 128 + g] = m_run[0];
      mine[ND * 128 + g + 8] = m_run[1];
      mine[ND * 128 + 16 + g] = l_run[0];
      mine[ND * 128 + 16 + g + 8] = l_run[1];
    }
    __syncthreads();
    if (wn != 0 && !p.cluster_merge) return;  // (in a cluster every thread takes part in the merge's barriers)
    for (int ww = 1; wn == 0 && ww < wn_count; ++ww) {
      const float* other = area + (wm * wn_count + ww) * Cfg::MERGE_FLOATS;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m2 = other[ND * 128 + g + 8 * h], l2 = other[ND * 128 + 16 + g + 8 * h];
        const float mm = fmaxf(m_run[h], m2);
        const float a1 = m_run[h] == -INFINITY ? 0.f : fast_exp2(m_run[h] - mm);
        const float a2 = m2 == -INFINITY ? 0.f : fast_exp2(m2 - mm);
        l_run[h] = l_run[h] * a1 + l2 * a2;
        m_run[h] = mm;
#pragma unroll
        for (int dn = 0; dn < ND; ++dn) {
          o[dn][2 * h] = o[dn][2 * h] * a1 + other[(dn * 4 + 2 * h) * 32 + lane] * a2;
          o[dn][2 * h + 1] = o[dn][2 * h + 1] * a1 + other[(dn * 4 + 2 * h + 1) * 32 + lane] * a2;
        }
      }
    }
  }

  if (p.cluster_merge) {
    const uint32_t o_s = s_base + uint32_t(Cfg::CLUSTER_O_OFF), lse_s = s_base + uint32_t(Cfg::CLUSTER_LSE_OFF);
    if (wn == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lr = wm * 16 + g + 8 * h;
        if (lr >= r_blk) continue;
        const float m = m_run[h], l = l_run[h];
        const float inv = l == 0.f ? 0.f : 1.f / l;  // NaN l (a NaN / +inf score) stays NaN
#pragma unroll
        for (int dn = 0; dn < ND; ++dn) {
          st_shared_f32x2(o_s + uint32_t((lr * D + dn * 8 + 2 * t4) * 4), o[dn][2 * h] * inv, o[dn][2 * h + 1] * inv);
        }
        if (t4 == 0) st_shared_f32(lse_s + uint32_t(lr * 4), l == 0.f ? -INFINITY : (m + __log2f(l)) * kLn2);
      }
    }
    timeline_stamp(p, 5);
    cluster_merge<T, D, kThreads>(p, o_s, lse_s, b, kvh, r_base, r_blk, [&](int k) { timeline_stamp(p, k); });
    timeline_stamp(p, 6);
    return;
  }

  timeline_stamp(p, 5);
  // Write: final out / lse (one split) or the split's normalised partial and LSE.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = r_base + wm * 16 + g + 8 * h;
    if (gr >= p.rows || wm * 16 + g + 8 * h >= r_blk) continue;
    const int i = gr / p.group, head = kvh * p.group + gr % p.group;
    const float m = m_run[h], l = l_run[h];
    if (p.num_splits == 1) {
      const float sink2 = p.sink_logits ? p.sink_logits[head] * kLog2e : -INFINITY;
      const float mf = fmaxf(m, sink2);
      const float fac = m == -INFINITY ? 0.f : fast_exp2(m - mf);
      const float lf = l * fac + (sink2 == -INFINITY ? 0.f : fast_exp2(sink2 - mf));
      const float mult = lf == 0.f ? 0.f : fac / lf;  // lf NaN: a NaN / +inf score or sink logit
      T* out = static_cast<T*>(p.out) + p.out_stride.offset(b, i, head);
#pragma unroll
      for (int dn = 0; dn < ND; ++dn) {
        const int col = dn * 8 + 2 * t4;
        out[col] = from_float<T>(o[dn][2 * h] * mult);
        out[col + 1] = from_float<T>(o[dn][2 * h + 1] * mult);
      }
      if (p.lse && t4 == 0) {
        p.lse[p.lse_stride.offset(b, head, i)] = lf == 0.f ? -INFINITY : (mf + __log2f(lf)) * kLn2;
      }
    } else {
      const int64_t idx = ((int64_t(b) * p.kv_heads + kvh) * p.rows + gr) * p.num_splits + split;
      const float inv = l == 0.f ? 0.f : 1.f / l;  // NaN l (a NaN / +inf score) stays NaN
      float* po = p.part_o + idx * D;
#pragma unroll
      for (int dn = 0; dn < ND; ++dn) {
        *reinterpret_cast<float2*>(po + dn * 8 + 2 * t4) = make_float2(o[dn][2 * h] * inv, o[dn][2 * h + 1] * inv);
      }
      if (t4 == 0) p.part_lse[idx] = l == 0.f ? -INFINITY : (m + __log2f(l)) * kLn2;
    }
  }
  timeline_stamp(p, 6);
}

}  // namespace flashlite::cuda_decode
