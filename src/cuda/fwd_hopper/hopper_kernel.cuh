#pragma once
// The Hopper forward kernel (sm_90a): FlashAttention-3-style warp specialisation with wgmma and TMA.
//
// Persistent: one CTA per SM walks work tiles (query tile of 128 or 192 rows, head, sequence) numbered in the
// mma.sync kernel's block order (block_order.h: heaviest causal tiles first, a group's K/V shared in L2). The key
// tiles a work tile visits (sink tiles, then the window / causal range) and the mask are those of the mma.sync kernel
// (fwd_common.cuh, row_mask.h), so both kernels skip and mask the same tiles. Which tile a CTA takes next:
//   static   (tile_counter null: uniform tiles) c, c + grid, c + 2 grid, ...
//   dynamic  (causal, windows, varlen: tiles of unequal work) CTA c starts with tile c, then takes the next tile of a
//            global counter (zeroed before the launch), greedily, as the hardware's block scheduler would; a static
//            walk of the causal order gave some CTAs all the heavy tiles (0.74x the one-CTA-per-tile grid, H100).
// The producer runs ahead across work tiles: Q is double-buffered, so the next tile's Q (announced in shared memory
// with its load) and first K/V tiles load while the consumers still work on the current one; a tile's start-up
// latency no longer leaves the tensor cores idle (it did with one CTA per tile at short S).
//   warpgroup 0, producer: gives registers away (setmaxnreg 24 or 32); one thread loads, per work tile, Q into the free
//     buffer and then, per key tile, the K and V tiles with TMA (cp.async.bulk.tensor, 128-byte swizzle,
//     out-of-bounds rows zero-filled) into a 2-stage ring; each load completes a transaction count on its "full"
//     mbarrier, and a K (V) buffer is reused only after all consumer warps arrived on its "empty" mbarrier, once
//     their S (P V) wgmma has completed.
//   warpgroups 1 to CONSUMERS (2: setmaxnreg 240, 384 threads; 3: 160, 512 threads): 64 query rows each. Per key tile:
//     S = Q K^T     wgmma m64n128k16, Q and K from shared memory through descriptors, fp32 accumulators
//     mask         boundary tiles only, the per-row key intervals of row_mask.h (a select: S = -inf whatever Q K^T
//                  was, so a NaN or Inf score of a masked key never reaches the softmax)
//     softmax      online, in registers, log2 units (scale * log2 e folded into one FFMA per score), exp2
//     O += P V     wgmma m64nDk16, P from registers (re-packed S accumulators), V from shared memory (N-major);
//                  varlen: on the tile that crosses the sequence end, the V rows past the end (the next sequence's,
//                  masked but 0 x Inf = NaN) are zeroed first (clear_v_tail)
//   At the end the sink logit joins the denominator; the LSE is written from registers, O is staged in the tile's
//     (now unread) Q buffer and leaves in 16-byte row chunks; then the buffer is released for the tile after next.
// The consumer loop overlaps within and across warpgroups (FlashAttention-3's ping-pong schedule; plainer schedules
// measured slower on the H100 and live in git history):
//   pipelined  S(n) and P(n-1) V(n-1) are in flight together and the softmax of S(n) runs while P V is still on the
//              tensor cores.
//   ping-pong  the consumer warpgroups take turns to issue their wgmmas (named barriers 1 .. CONSUMERS), so one's
//              softmax runs under the others' GEMMs.
// Registers (ptxas -v, SASS): with two P buffers a few per-thread values of the work tile's setup are spilled and
// reloaded once per work tile (28 bytes at D128, 4 at D64); with one, 4 bytes at D128; three warpgroups at D64 spill
// 144 bytes, among them the running max and sum, reloaded once per key tile from L1.
// Next steps (docs/performance.md): wider key tiles at D128, exp2 partly on FMA, fewer registers for three warpgroups.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/context_cache.h"
#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/row_mask.h"
#include "cuda/fwd_hopper/hopper_ptx.cuh"
#include "cuda/fwd_hopper/hopper_wgmma.cuh"

namespace flashlite::cuda_fwd_hopper {

using cuda_fwd::FwdParams;

// Kernel argument: the three tensor maps (64-byte aligned, read by TMA from the parameter space) and the fused
// kernel's parameters (strides, lengths, mask, varlen tables, scale, softcap, sinks, LSE).
struct HopperParams {
  CUtensorMap tq, tk, tv;
  FwdParams f;
  unsigned* tile_counter;  // the dynamic schedule's counter, zero at launch; null: the static schedule
};

// D_: head_dim; CONSUMERS_: consumer warpgroups of 64 query rows, 2 or 3; P_BUFFERS_: P register buffers of a consumer
// (the pipeline below), 1 or 2. HopperShape (hopper_fwd.h) says which runs.
template <int D_, int CONSUMERS_, int P_BUFFERS_>
struct HopperTile {
  static constexpr int CONSUMERS = CONSUMERS_, P_BUFFERS = P_BUFFERS_;
  static_assert(P_BUFFERS == 1 || (P_BUFFERS == 2 && CONSUMERS == 2), "two P buffers need two warpgroups' registers");
  static constexpr int D = D_, BR = 64 * CONSUMERS, BC = 128, STAGES = 2, THREADS = 128 * (CONSUMERS + 1);
  static constexpr int CONSUMER_THREADS = 128 * CONSUMERS;
  static constexpr int DB = D / 64;                         // 64-column blocks: one 128-byte swizzle row each
  static constexpr uint32_t Q_BLOCK = BR * 128;              // bytes of one 64-column block of the Q tile
  static constexpr uint32_t KV_BLOCK = BC * 128;             // ... of a K or V tile
  static constexpr uint32_t Q_BYTES = DB * Q_BLOCK;
  static constexpr uint32_t KV_BYTES = DB * KV_BLOCK;
  static constexpr uint32_t OFF_K = 2 * Q_BYTES;             // [2] Q tiles, then [stage] K tiles
  static constexpr uint32_t OFF_V = OFF_K + STAGES * KV_BYTES;  // [stage] V tiles
  static constexpr uint32_t OFF_BAR = OFF_V + STAGES * KV_BYTES;
  static constexpr uint32_t SMEM_BYTES = OFF_BAR + 128 + 1024;  // barriers, and slack to align the base to 1024
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
  // setmaxnreg: the producer warpgroup gives registers back, the consumer warpgroups take them. The CTA's pool is
  // what the kernel was compiled with (__launch_bounds__(THREADS, 1) on 64K registers: 168 per thread for 384 threads,
  // 128 for 512; ptxas -v says so); if the warpgroups asked for more than the pool holds, setmaxnreg.inc would wait
  // forever.
  static constexpr int REGS_PRODUCER = CONSUMERS == 2 ? 24 : 32, REGS_CONSUMER = CONSUMERS == 2 ? 240 : 160;
  static constexpr int REGS_ENTRY = 65536 / THREADS / 8 * 8;
  static_assert(REGS_PRODUCER % 8 == 0 && REGS_CONSUMER % 8 == 0 && REGS_PRODUCER >= 24 && REGS_CONSUMER <= 256,
                "setmaxnreg counts are multiples of 8 in [24, 256]");
  static_assert(128 * REGS_PRODUCER + CONSUMER_THREADS * REGS_CONSUMER <= THREADS * REGS_ENTRY,
                "setmaxnreg would exceed the pool");
};

template <class T, int D, int CONSUMERS, int P_BUFFERS>
__global__ void __launch_bounds__(HopperTile<D, CONSUMERS, P_BUFFERS>::THREADS, 1)
    fwd_hopper_kernel(const __grid_constant__ HopperParams hp) {
  using Cfg = HopperTile<D, CONSUMERS, P_BUFFERS>;
  constexpr int BR = Cfg::BR, BC = Cfg::BC, DB = Cfg::DB, STAGES = Cfg::STAGES, NC = Cfg::CONSUMERS;
  constexpr int CT = Cfg::CONSUMER_THREADS;
  const FwdParams& p = hp.f;
  extern __shared__ __align__(1024) unsigned char smem_raw[];

  // The block_order.h grid this CTA walks with stride gridDim.x (at most 2^31 - 1 tiles: eligibility.cpp).
  const unsigned work_tiles = unsigned(p.q_tiles) * unsigned(p.q_heads) * unsigned(p.batch);
  // A work tile's query rows, lengths, and the key tiles it visits.
  struct Work {
    cuda_fwd::BlockWork w;
    int i0;
    cuda_fwd::KeyTiles kt;
  };
  const auto work = [&](unsigned tile, Work& x) {
    // False for a tile past a varlen sequence's end (the grid has the longest sequence's tiles).
    if (!cuda_fwd::decode_block(p, BR, x.w, int(tile))) return false;
    x.i0 = x.w.tile * BR;
    x.kt = cuda_fwd::key_tiles(p.mask, x.i0, min(x.i0 + BR, x.w.sq), x.w.sq, x.w.sk, BC);
    return true;
  };

  // Shared memory (32-bit addresses, base aligned to 1024 for the swizzle): Q[2] | K[2] | V[2] | barriers.
  // Q is double-buffered across work tiles (buffer = work tiles done % 2), so the next tile's Q loads while this one
  // runs; a finished tile's Q buffer then stages its O for coalesced stores (the epilogue) before it is released.
  const uint32_t base = (cuda_fwd::smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar = base + Cfg::OFF_BAR;
  const auto sQ = [&](int qb) { return base + uint32_t(qb) * Cfg::Q_BYTES; };
  const auto sK = [&](int st) { return base + Cfg::OFF_K + uint32_t(st) * Cfg::KV_BYTES; };
  const auto sV = [&](int st) { return base + Cfg::OFF_V + uint32_t(st) * Cfg::KV_BYTES; };
  const auto q_full = [&](int qb) { return bar + 8u * uint32_t(qb); };
  const auto k_full = [&](int st) { return bar + 16u + 8u * uint32_t(st); };
  const auto v_full = [&](int st) { return bar + 32u + 8u * uint32_t(st); };
  const auto k_empty = [&](int st) { return bar + 48u + 8u * uint32_t(st); };
  const auto v_empty = [&](int st) { return bar + 64u + 8u * uint32_t(st); };
  // Every consumer thread is done with Q buffer qb: its S wgmmas have landed, its O is out of the staging, and it has
  // read the tile slot.
  const auto q_empty = [&](int qb) { return bar + 80u + 8u * uint32_t(qb); };
  // The work tile whose Q the last q_full(qb) phase brought (work_tiles: none left); written by the producer before
  // its arrival on q_full(qb), read by the consumers after their wait (the arrival releases, the wait acquires).
  const auto tile_slot = [&](int qb) { return bar + 96u + 4u * uint32_t(qb); };

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int qb = 0; qb < 2; ++qb) {
      mbar_init(q_full(qb), 1);
      mbar_init(q_empty(qb), CT);  // every consumer thread: each releases its own reads and staging stores
    }
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(k_full(st), 1);
      mbar_init(v_full(st), 1);
      mbar_init(k_empty(st), 4 * NC);  // one arrival per consumer warp
      mbar_init(v_empty(st), 4 * NC);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp < 4) {
    // ---------------------------------------------------------------- producer warpgroup
    regs_dealloc<Cfg::REGS_PRODUCER>();
    if (warp == 0 && lane == 0) {
      tma_prefetch_map(&hp.tq);
      tma_prefetch_map(&hp.tk);
      tma_prefetch_map(&hp.tv);
      // The tile after `tile` (< 2^31 + grid + 2^31: no unsigned overflow).
      const auto next_tile = [&](unsigned tile) {
        return hp.tile_counter ? atomicAdd(hp.tile_counter, 1u) + gridDim.x : tile + gridDim.x;
      };
      // it: K/V tiles loaded so far by this CTA (the ring's stage and phase run on across work tiles);
      // done: work tiles.
      unsigned it = 0;  // unsigned: wraps consistently (STAGES divides 2^32) on however many tiles a CTA walks
      int done = 0;
      for (unsigned tile = blockIdx.x;; tile = next_tile(tile)) {
        Work x;
        const bool more = tile < work_tiles;
        if (more && !work(tile, x)) continue;  // a varlen sequence shorter than the grid's tiles: nothing to do
        const int qb = done & 1;
        mbar_wait(q_empty(qb), uint32_t((done >> 1) & 1) ^ 1u);  // work tile done - 2 has left the buffer
        st_shared_u32(tile_slot(qb), more ? tile : work_tiles);
        if (!more) {
          mbar_arrive(q_full(qb));  // the consumers' last phase: no tile, no bytes
          break;
        }
        const int head = x.w.head, kvh = x.w.head / p.group, tb = int(x.w.tb);
        const int qrow = int(x.w.q_row0) + x.i0, krow0 = int(x.w.k_row0);
        mbar_arrive_expect_tx(q_full(qb), Cfg::Q_BYTES);
#pragma unroll
        for (int c = 0; c < DB; ++c) {
          tma_load_4d(sQ(qb) + uint32_t(c) * Cfg::Q_BLOCK, &hp.tq, q_full(qb), c * 64, qrow, head, tb);
        }
        for (int n = 0; n < x.kt.count; ++n, ++it) {
          const int st = int(it % STAGES);
          const uint32_t free_parity = uint32_t((it / STAGES) & 1) ^ 1u;  // a fresh barrier passes parity 1
          const int krow = krow0 + x.kt.tile(n) * BC;
          mbar_wait(k_empty(st), free_parity);
          mbar_arrive_expect_tx(k_full(st), Cfg::KV_BYTES);
#pragma unroll
          for (int c = 0; c < DB; ++c) {
            tma_load_4d(sK(st) + uint32_t(c) * Cfg::KV_BLOCK, &hp.tk, k_full(st), c * 64, krow, kvh, tb);
          }
          mbar_wait(v_empty(st), free_parity);
          mbar_arrive_expect_tx(v_full(st), Cfg::KV_BYTES);
#pragma unroll
          for (int c = 0; c < DB; ++c) {
            tma_load_4d(sV(st) + uint32_t(c) * Cfg::KV_BLOCK, &hp.tv, v_full(st), c * 64, krow, kvh, tb);
          }
        }
        ++done;
      }
    }
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    regs_alloc<Cfg::REGS_CONSUMER>();
    const int cw = warp / 4 - 1;              // consumer warpgroup: rows [64 cw, 64 cw + 64) of the tile
    const int g = lane / 4, t = lane % 4;     // accumulator fragment: row group, thread in group
    const int row_w = cw * 64 + (warp % 4) * 16;  // this warp's first row within the tile

    // Scale folded into the exponent unless a softcap (or a non-positive scale) transforms the scores first.
    const bool transform = p.softcap || !(p.scale_log2 > 0.f);
    const float mult = transform ? 1.f : p.scale_log2;
    // Long rows (cuda_fwd::kFoldKeys): this consumer thread's fold slot. Recomputed where used from the parameters
    // and special registers, so the hot loop holds nothing more.
    constexpr int FOLD_TILES = cuda_fwd::kFoldKeys / BC;
    static_assert(FOLD_TILES % 2 == 0, "folds happen after whole pairs of tiles");

    // S = Q K^T of the tile in stage st, issued and committed (not waited for). Q and K are K-major.
    const auto issue_s = [&](float (&s)[BC / 2], uint32_t q_wg, int st) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t qoff = uint32_t(kk / 4) * Cfg::Q_BLOCK + uint32_t(kk % 4) * 32u;
        const uint32_t koff = uint32_t(kk / 4) * Cfg::KV_BLOCK + uint32_t(kk % 4) * 32u;
        wgmma_ss_n128(s, smem_desc(q_wg + qoff, 16, 1024), smem_desc(sK(st) + koff, 16, 1024), kk > 0 ? 1 : 0, T{});
      }
      wgmma_commit();
    };

    // Ping-pong: each issue of wgmmas is a turn, and the warpgroups take turns in a cycle 0, 1, (2,) 0, ...:
    // warpgroup cw waits on barrier 1 + cw for the previous one's turn to end (128 of its threads sync, the previous
    // one's 128 arrive). All work on the same tiles and take the same number of turns per work tile, so the cycle runs
    // on across work tiles: the last warpgroup lets warpgroup 0 start once, and warpgroup 0 takes one extra sync after
    // its last tile for the last one's last arrival. Barrier ids: 1..NC turns, NC + 1 the V tail, NC + 2 + cw staging.
    const auto turn_begin = [&] { named_sync(1 + cw, 256); };
    const auto turn_end = [&] { named_arrive(1 + (cw + 1) % NC, 256); };
    if (cw == NC - 1) named_arrive(1, 256);

    // it0: K/V tiles consumed so far by this CTA (the ring's stage and phase, as the producer counts them);
    // done: work tiles finished (Q's phase).
    unsigned it0 = 0;  // as the producer's count
    int done = 0;
    for (;;) {
      const int qb = done & 1;
      mbar_wait(q_full(qb), uint32_t((done >> 1) & 1));  // this tile's Q has landed, or the producer announced the end
      const unsigned tile = ld_shared_u32(tile_slot(qb));
      const uint32_t q_wg = sQ(qb) + uint32_t(cw) * 64u * 128u;  // this warpgroup's Q rows (of each 64-column block)
      if (tile >= work_tiles) break;
      Work x;
      work(tile, x);  // a tile the producer found work in
      const cuda_fwd::BlockWork& w = x.w;
      const cuda_fwd::KeyTiles& kt = x.kt;
      const int sq = w.sq, sk = w.sk;
      const int wr0 = x.i0 + row_w, wr1 = min(wr0 + 16, sq);

      float o[D / 2];  // O: n8 block i / 4 of the warp's 16 rows x D
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

      // Rows that fold do so first after the pair of tiles that ends at tile FOLD_TILES. The fold space is per work
      // tile (FwdParams::fold).
      const auto folds = [&] { return p.fold != nullptr && kt.count > FOLD_TILES + 1; };
      const auto fold_slot = [&] {
        const int64_t block = int64_t(tile) * cuda_fwd::fold_floats_per_block(BR, D);
        return cuda_fwd::FoldSlot{p.fold + block + (threadIdx.x - 128), CT};
      };
      const auto o_at = [&](int i) -> float& { return o[i]; };
      const auto m_at = [&](int r) -> float& { return m_run[r]; };
      const auto l_at = [&](int r) -> float& { return l_run[r]; };
      // The ring position of this work tile's key tile n.
      const auto stage = [&](int n) { return int((it0 + unsigned(n)) % STAGES); };
      const auto phase = [&](int n) { return uint32_t(((it0 + unsigned(n)) / STAGES) & 1u); };

      // Varlen: the K/V tensor maps end at the last sequence's end, not this one's, so the key tile that crosses this
      // sequence's end (j0 < sk < j0 + BC) holds the next sequence's first rows. Their keys are masked (P = 0), but a
      // non-finite V there would still give 0 x Inf = NaN in P V. On that tile only (v_tail; -1: none), after its V
      // has landed and before the P V wgmma, the consumer threads zero the V rows [sk - j0, BC) in shared memory.
      // Padded batches and the last sequence need nothing: TMA zero-fills rows past a map's end.
      // Layout: each 64-column block of a V stage is BC rows of 128 bytes (the TMA box; key r in row r, as the P V
      // descriptors read it), and the 128-byte swizzle only permutes the 16-byte chunks within a row (chunk ^= r % 8),
      // so keys [r0, BC) are bytes [128 r0, 128 BC) of every block. The stores are fenced into the async proxy (wgmma
      // reads V through it), and the warpgroups meet on named barrier NC + 1 before any issues its wgmma: each reads
      // all BC rows. All visit the same tiles, so all reach the barrier (in ping-pong, before the turn: no cycle
      // with the turn barriers). The producer cannot refill the stage meanwhile: it waits for every consumer warp's
      // v_empty arrival, each after that warp's wgmma.
      const int v_tail =
          p.varlen != cuda_fwd::VarlenMode::padded && w.seq + 1 < p.batch && sk % BC != 0 ? sk / BC : -1;
      const auto clear_v_tail = [&](int n, int st) {
        if (__builtin_expect(kt.tile(n) != v_tail, 1)) return;
#pragma unroll 1  // rare: kept small, off the hot loop's instruction footprint
        for (int i = (sk % BC) * 8 + int(threadIdx.x) - 128; i < BC * 8; i += CT) {  // 16-byte chunk i of each block
#pragma unroll
          for (int c = 0; c < DB; ++c) st_shared_zero16(sV(st) + uint32_t(c) * Cfg::KV_BLOCK + uint32_t(i) * 16u);
        }
        fence_proxy_async_smem();
        named_sync(NC + 1, CT);
      };

      // O += P V of the tile in stage st (V N-major), issued and committed: two n8 blocks of S form one k16 A
      // fragment (the mma.sync A layout, per warp of the group).
      const auto issue_pv = [&](const uint32_t (&pk)[BC / 8][2], int st) {
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < BC / 16; ++kb) {
          const uint32_t a[4] = {pk[2 * kb][0], pk[2 * kb][1], pk[2 * kb + 1][0], pk[2 * kb + 1][1]};
          const uint64_t vd = smem_desc(sV(st) + uint32_t(kb) * 16u * 128u, Cfg::KV_BLOCK, 1024);
          if constexpr (D == 128) {
            wgmma_rs_n128(o, a, vd, 1, T{});
          } else {
            wgmma_rs_n64(o, a, vd, 1, T{});
          }
        }
        wgmma_commit();
      };
      // Softmax of one score tile (keys j0 ...): transform, mask, running max and sum; s becomes P (fp32, packed to
      // 16-bit pairs by pack_p); alpha = the factor O must be rescaled by, raised = some row of the warp needs it.
      const auto softmax = [&](float (&s)[BC / 2], int j0, float (&alpha)[2]) {
        if (transform) {
#pragma unroll
          for (int i = 0; i < BC / 2; ++i) {
            const float v = s[i];
            s[i] = p.softcap ? p.softcap_post * cuda_fwd::accurate_tanh(v * p.softcap_pre) : v * p.scale_log2;
          }
        }
        // The mask, on boundary tiles only (a warp wholly past the sequence end computes on zeros, writes nothing).
        const bool full = wr0 >= sq || (j0 + BC <= sk && tile_fully_visible(p.mask, wr0, wr1, j0, j0 + BC, sq, sk));
        if (!full) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const cuda_fwd::RowKeys rk = cuda_fwd::row_keys(p.mask, wr0 + g + r * 8, sq, sk);
            const int lo = cuda_fwd::clamp_to(rk.lo - j0, -1, BC), hi = cuda_fwd::clamp_to(rk.hi - j0, -1, BC);
            const int se = cuda_fwd::clamp_to(rk.sink_end - j0, 0, BC);
#pragma unroll
            for (int nj = 0; nj < BC / 8; ++nj)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = nj * 8 + 2 * t + e;
                if (!((j >= lo && j <= hi) || j < se)) s[nj * 4 + 2 * r + e] = -INFINITY;  // a select, not an add
              }
          }
        }
        // A quad of lanes shares a row; m_run is in score units (log2 units times 1 / mult).
        bool raised = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nj = 0; nj < BC / 8; ++nj) mx = fmaxf(mx, fmaxf(s[nj * 4 + 2 * r], s[nj * 4 + 2 * r + 1]));
          mx = cuda_fwd::quad_max(mx);
          const float m_old = m_run[r];
          const float m_new = fmaxf(m_old, mx);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid -inf - -inf
          alpha[r] = cuda_fwd::fast_exp2((m_old - m_use) * mult);
          raised |= m_new > m_old && m_old > -INFINITY;  // else O is still zero or unchanged
          m_run[r] = m_new;
          const float neg = -m_use * mult;
          float sum = 0.f;
#pragma unroll
          for (int nj = 0; nj < BC / 8; ++nj) {
            const float p0 = cuda_fwd::fast_exp2(fmaf(s[nj * 4 + 2 * r], mult, neg));
            const float p1 = cuda_fwd::fast_exp2(fmaf(s[nj * 4 + 2 * r + 1], mult, neg));
            sum += p0 + p1;
            s[nj * 4 + 2 * r] = p0, s[nj * 4 + 2 * r + 1] = p1;
          }
          l_run[r] = l_run[r] * alpha[r] + sum;
        }
        return __any_sync(0xffffffffu, raised);
      };
      // P to 16-bit pairs, pk[n8 block][row half]: the A fragments of the P V wgmma.
      const auto pack_p = [&](const float (&s)[BC / 2], uint32_t (&pk)[BC / 8][2]) {
#pragma unroll
        for (int nj = 0; nj < BC / 8; ++nj)
#pragma unroll
          for (int r = 0; r < 2; ++r) pk[nj][r] = cuda_fwd::pack2<T>(s[nj * 4 + 2 * r], s[nj * 4 + 2 * r + 1]);
      };
      const auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
          o[dn * 4 + 0] *= alpha[0];
          o[dn * 4 + 1] *= alpha[0];
          o[dn * 4 + 2] *= alpha[1];
          o[dn * 4 + 3] *= alpha[1];
        }
      };

      // Overlapped within the warpgroup (FlashAttention-3's intra-warpgroup pipelining): S(n) is issued, then
      // P(n-1) V(n-1); the softmax of S(n) runs while P V is still on the tensor cores, and O is rescaled by tile n's
      // factor only after P(n-1) V(n-1) has landed. The P an in-flight wgmma reads is pinned until after its wait, so
      // the compiler cannot reuse its registers early. Cfg::P_BUFFERS:
      //   2  P(n) is packed during the softmax into the buffer P(n-1) does not hold (pa, pb alternate; no copy): the
      //      shortest chain from S(n) to the next turn;
      //   1  P(n) is packed into P(n-1)'s registers once its P V has landed (pb is pa): 32 registers fewer.
      uint32_t pa[BC / 8][2], pb_own[BC / 8][2];
      uint32_t (&pb)[BC / 8][2] = Cfg::P_BUFFERS == 2 ? pb_own : pa;
      // Tile n: P(n-1) in p_prev (read by the wgmma), P(n) into p_next.
      const auto step = [&](int n, uint32_t (&p_prev)[BC / 8][2], uint32_t (&p_next)[BC / 8][2]) {
        const int st = stage(n), prev = stage(n - 1);
        float s[BC / 2];
        float alpha[2];
        mbar_wait(k_full(st), phase(n));
        mbar_wait(v_full(prev), phase(n - 1));
        clear_v_tail(n - 1, prev);
        turn_begin();
        issue_s(s, q_wg, st);
        issue_pv(p_prev, prev);
        turn_end();
        wgmma_wait<1>();  // S(n) has landed; P(n-1) V(n-1) may still run
        pin_regs(s);
        if (lane == 0) mbar_arrive(k_empty(st));
        const bool raised = softmax(s, kt.tile(n) * BC, alpha);
        if constexpr (Cfg::P_BUFFERS == 2) pack_p(s, p_next);
        wgmma_wait<0>();
        pin_regs(o);
        pin_regs(p_prev);
        if (lane == 0) mbar_arrive(v_empty(prev));
        if (raised) rescale(alpha);
        if constexpr (Cfg::P_BUFFERS == 1) pack_p(s, p_next);
      };
      const auto last_pv = [&](uint32_t (&p_last)[BC / 8][2]) {
        const int last = kt.count - 1, st = stage(last);
        mbar_wait(v_full(st), phase(last));
        clear_v_tail(last, st);
        turn_begin();
        issue_pv(p_last, st);
        turn_end();
        wgmma_wait<0>();
        pin_regs(o);
        pin_regs(p_last);
        if (lane == 0) mbar_arrive(v_empty(st));
      };
      if (kt.count > 0) {
        float s[BC / 2];
        float alpha[2];
        mbar_wait(k_full(stage(0)), phase(0));
        turn_begin();
        issue_s(s, q_wg, stage(0));
        turn_end();
        wgmma_wait<0>();
        pin_regs(s);
        if (lane == 0) mbar_arrive(k_empty(stage(0)));
        softmax(s, kt.tile(0) * BC, alpha);  // O is still zero: no rescale
        pack_p(s, pa);
        // Long rows: the pairs of tiles in segments; after the pair that ends at tile k * FOLD_TILES, O (tiles before
        // it) and the sums (tiles up to it) leave the wgmma accumulators, all relative to the same running max, and
        // P(k * FOLD_TILES) joins the emptied O in the next step (kFoldKeys). The inner loop is the loop as it would
        // be without folding (a test inside it cost the short rows 2%).
        // Two P buffers alternate over pairs of tiles; one takes a plain loop (unrolled in pairs it spilled, ptxas).
        int n = 1;
        for (int seg = FOLD_TILES + 1;; seg += FOLD_TILES) {
          const int limit = min(kt.count, seg);
          if constexpr (Cfg::P_BUFFERS == 2) {
            for (; n + 1 < limit; n += 2) {
              step(n, pa, pb);
              step(n + 1, pb, pa);
            }
          } else {
            for (; n < limit; ++n) step(n, pa, pa);
          }
          if (limit == kt.count) break;
          if (p.fold != nullptr) {
            cuda_fwd::fold_out<D / 2, 2>(fold_slot(), o_at, m_at, l_at, mult, seg == FOLD_TILES + 1);
          }
        }
        if constexpr (Cfg::P_BUFFERS == 2) {
          if (n < kt.count) {  // one tile left: P(n-1) is in pa
            step(n, pa, pb);
            last_pv(pb);
          } else {
            last_pv(pa);
          }
        } else {
          last_pv(pa);
        }
      }
      if (folds()) cuda_fwd::fold_in<D / 2, 2>(fold_slot(), o_at, m_at, l_at, mult);

      // Epilogue: normalise (the sink logit joins the denominator) and write the LSE; O goes through this warpgroup's
      // rows of the Q buffer (every S wgmma that read them has landed), so that each row leaves in 16-byte chunks
      // (rows of the accumulator fragments are 16 bytes wide: 4-byte stores to rows 4 KB apart cost a quarter of the
      // tile's time at S 512, ncu). Staging address of row r (0..BR-1 in the tile), 16-byte chunk c: the TMA layout,
      // 64-column blocks of 128-byte rows, chunk c % 8 swizzled by r % 8, so both the fragment writes (8 rows x one
      // chunk per instruction) and the row reads (8 chunks of one row per quarter warp) hit 32 distinct banks.
      const uint32_t stage_o = sQ(qb);
      const auto staged = [&](int r, int c) {
        return stage_o + uint32_t(c / 8) * Cfg::Q_BLOCK + uint32_t(r) * 128u + uint32_t(((c % 8) ^ (r % 8)) * 16);
      };
      const float sink2 = p.sink_logits ? p.sink_logits[w.head] * cuda_fwd::kLog2e : -INFINITY;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float lse;
        const float f = cuda_fwd::finish_row(m_run[r] * mult, cuda_fwd::quad_sum(l_run[r]), sink2, lse);
        const int row_t = row_w + g + r * 8, row = x.i0 + row_t;  // within the tile, within the sequence
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
          st_shared_u32(staged(row_t, dn) + 4u * uint32_t(t),
                        cuda_fwd::pack2<T>(o[dn * 4 + 2 * r] * f, o[dn * 4 + 2 * r + 1] * f));
        }
        if (p.lse && t == 0 && row < sq) {
          p.lse[w.tb * p.lse_stride.batch + w.head * p.lse_stride.head + (w.q_row0 + row) * p.lse_stride.seq] = lse;
        }
      }
      named_sync(NC + 2 + cw, 128);  // this warpgroup's staging is complete
      T* og = static_cast<T*>(p.out) + w.tb * p.out_stride.batch + w.q_row0 * p.out_stride.seq +
          w.head * p.out_stride.head;
      constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
#pragma unroll 1  // unrolled, the loop's addresses were hoisted out of the tile loop and spilled
      for (int i = int(threadIdx.x) % 128; i < 64 * CHUNKS; i += 128) {
        const int row_t = cw * 64 + i / CHUNKS, c = i % CHUNKS, row = x.i0 + row_t;
        if (row < sq) {
          const uint4 v = ld_shared_16(staged(row_t, c));
          T* dst = og + int64_t(row) * p.out_stride.seq + c * 8;
          if (p.vec_out) {
            *reinterpret_cast<uint4*>(dst) = v;
          } else {  // rows 4-byte aligned only (hopper_fwd_reject_reason)
            uint32_t* d4 = reinterpret_cast<uint32_t*>(dst);
            d4[0] = v.x, d4[1] = v.y, d4[2] = v.z, d4[3] = v.w;
          }
        }
      }
      // This thread's reads of the buffer are done; the next work tile but one may load into it. Its generic-proxy
      // staging stores are ordered before that TMA (async proxy) write by the fence.
      fence_proxy_async_smem();
      mbar_arrive(q_empty(qb));
      it0 += unsigned(kt.count);
      ++done;
    }
    if (cw == 0) named_sync(1, 256);  // the last warpgroup's last arrival
  }
}

// Raises the kernel's dynamic shared-memory limit once per device and context (again after a cudaDeviceReset);
// false on failure.
template <class Kernel>
bool hopper_smem_optin(Kernel* kernel, int bytes, ::flashlite::cuda::PerContextFlag& done) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (done.done(dev)) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) return false;
  done.mark(dev);
  return true;
}

// Launches one instantiation: `ctas` persistent CTAs (one per SM; fewer when there are fewer work tiles).
// Instantiated once per variant file (wgmma_<dtype>_d<D>.cu); launch_hopper.cu only refers to them. Returns the
// launch error, if any.
template <class T, int D, int CONSUMERS, int P_BUFFERS>
cudaError_t launch_hopper_variant(const HopperParams& hp, int ctas, cudaStream_t stream) {
  using Cfg = HopperTile<D, CONSUMERS, P_BUFFERS>;
  const auto kernel = fwd_hopper_kernel<T, D, CONSUMERS, P_BUFFERS>;
  static ::flashlite::cuda::PerContextFlag configured;
  constexpr int smem = int(Cfg::SMEM_BYTES);
  if (!hopper_smem_optin(kernel, smem, configured)) return cudaGetLastError();
  kernel<<<unsigned(ctas), Cfg::THREADS, smem, stream>>>(hp);
  return cudaGetLastError();
}

// (dtype, head_dim, consumer warpgroups, P buffers): the shapes hopper_shape can choose.
#define FL_HOPPER_VARIANTS(X)  \
  X(__nv_bfloat16, 64, 2, 2)   \
  X(__nv_bfloat16, 64, 3, 1)   \
  X(__nv_bfloat16, 128, 2, 1)  \
  X(__nv_bfloat16, 128, 2, 2)  \
  X(__half, 64, 2, 2)          \
  X(__half, 64, 3, 1)          \
  X(__half, 128, 2, 1)         \
  X(__half, 128, 2, 2)

#define FL_HOPPER_EXTERN(T, D, C, P) \
  extern template cudaError_t launch_hopper_variant<T, D, C, P>(const HopperParams&, int, cudaStream_t);
FL_HOPPER_VARIANTS(FL_HOPPER_EXTERN)
#undef FL_HOPPER_EXTERN

}  // namespace flashlite::cuda_fwd_hopper
