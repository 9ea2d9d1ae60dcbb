#pragma once
// The Hopper backward kernels (sm_90a): the two-kernel, atomic-free design of the mma.sync backward (bwd_kernels.cuh)
// on wgmma and TMA, with FlashAttention-3's warp specialisation. Every operand layout is one the Hopper forward kernel
// already uses: Q / K / V / dO tiles land by TMA with the 128-byte swizzle, the score products read both operands from
// shared memory (K-major), and the products with P or dS take them from registers (the accumulator re-packed as the A
// fragment) against an N-major tile.
//
//   bwd_hopper_dkdv_kernel  one CTA of 384 threads per (128 keys, kv head, sequence); warpgroup 0 is the producer (one
//     thread: K and V once, then the Q and dO tiles of 64 rows of every (q head of the group, q block) that can see
//     the keys, through a ring of STAGES stages); warpgroups 1 and 2 own 64 keys each and, per q block:
//       S^T  = K Q^T,  dP^T = V dO^T       wgmma m64n64k16, both operands from shared memory
//       P^T  = exp2(S^T scale log2e - L log2e), dS^T = P^T (dP^T - D) (softcap through the tanh), masked per element
//              on partly visible tiles (the row terms of the 64 q rows sit in shared memory, one copy per
//              consumer warpgroup, which writes the next block's while this block's products run)
//       dV  += P^T dO, dK += dS^T Q       wgmma m64nDk16, A from registers, B (dO, Q) N-major
//     dK (times scale) and dV are written from registers once, at the end.
//   bwd_hopper_dq_kernel  one CTA per (128 query rows, q head, sequence); the producer loads Q and dO once and the
//     K / V tiles (64 keys at D128, 128 at D64) that the rows see (the forward's KeyTiles) through the ring;
//     warpgroups 1 and 2 own 64 rows each: S = Q K^T, dP = dO V^T, dS as above, dQ += dS K (K N-major); dQ (times
//     scale) from registers. A warpgroup skips the tiles none of its rows sees, takes a 128-key tile (D64) over its
//     first 64 keys when its rows see none of the rest (the causal diagonal), and past the window the sink tile's
//     first 16 keys alone (n16 products). Each warpgroup also writes its 64 rows' share of dsink (-sum exp(sink -
//     L_i) D_i, in row order) into the workspace slot the mma.sync dQ kernel would fill for the same 64-row tile, so
//     launch.cu's dsink sum is shared.
// D = dout . out comes from bwd_delta_kernel (src/cuda/bwd/) before both. No atomics: every run gives the same bits.
// Rows past a sequence: in padded batches (and after the last varlen sequence) they are past the tensor map's end and
// land as zeros. Inside a varlen batch a tile that crosses a sequence's end holds the next sequence's first rows:
// their scores are masked (P = dS = 0), but 0 x Inf = NaN would still carry a non-finite value of another sequence
// into dV / dK (its dO and Q rows, dK/dV kernel) or dQ (its K rows, dQ kernel), so the consumers zero those rows in
// shared memory first (zero_tail), as the forward does with V.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bwd/bwd_common.cuh"
#include "cuda/common/context_cache.h"
#include "cuda/fwd/fwd_launch.h"  // ensure_smem_optin
#include "cuda/fwd_hopper/hopper_ptx.cuh"
#include "cuda/fwd_hopper/hopper_wgmma.cuh"

namespace flashlite::cuda_bwd_hopper {

using cuda_bwd::BwdParams;
using cuda_fwd_hopper::mbar_arrive;
using cuda_fwd_hopper::mbar_arrive_expect_tx;
using cuda_fwd_hopper::mbar_init;
using cuda_fwd_hopper::mbar_init_fence;
using cuda_fwd_hopper::named_sync;
using cuda_fwd_hopper::pin_regs;
using cuda_fwd_hopper::regs_alloc;
using cuda_fwd_hopper::regs_dealloc;
using cuda_fwd_hopper::smem_desc;
using cuda_fwd_hopper::tma_load_4d;
using cuda_fwd_hopper::tma_prefetch_map;
using cuda_fwd_hopper::wgmma_commit;
using cuda_fwd_hopper::wgmma_fence;
using cuda_fwd_hopper::wgmma_rs_n128;
using cuda_fwd_hopper::wgmma_rs_n64;
using cuda_fwd_hopper::wgmma_ss_n128;
using cuda_fwd_hopper::wgmma_ss_n16;
using cuda_fwd_hopper::wgmma_ss_n64;
using cuda_fwd_hopper::wgmma_wait;

// Kernel argument: the tensor maps of q, k, v, dout (boxes of 64 rows x 64 columns) and the backward's parameters.
struct HopperBwdParams {
  CUtensorMap tq, tk, tv, tdo;
  BwdParams b;
  int key_blocks = 0;  // cdiv(seq_k, 128): dK/dV CTAs per (sequence, kv head)
  int row_blocks = 0;  // cdiv(seq_q, 128): dQ CTAs per (sequence, q head)
};

template <int D_>
struct BwdHopperTile {
  static constexpr int D = D_, DB = D / 64, THREADS = 384, STAGES = 3;
  static constexpr int BOX = 64;  // rows of one TMA box (the tensor maps'), 64 columns (one 128-byte swizzle row)
  // dK/dV kernel: BN keys per CTA, q blocks of BM rows. Tiles are DB blocks of 64 columns, each `rows` x 128 bytes.
  static constexpr int BN = 128, BM = D == 64 ? 128 : 64;
  static constexpr uint32_t KV_BLOCK = BN * 128, KV_BYTES = DB * KV_BLOCK;  // K or V: one 64-column block, all
  static constexpr uint32_t QM_BLOCK = BM * 128, QM_BYTES = DB * QM_BLOCK;  // Q or dO of one q block
  static constexpr uint32_t ROW_BYTES = 5 * BM * 4;  // per q row: L log2e, D, then lo, hi, sink end (ints)
  static constexpr uint32_t BAR_BYTES = 8 + 16 * STAGES;  // Barriers: once, then full and empty per stage
  static constexpr uint32_t KV_OFF_V = KV_BYTES;
  static constexpr uint32_t KV_OFF_Q = 2 * KV_BYTES;                      // [stage] Q
  static constexpr uint32_t KV_OFF_O = KV_OFF_Q + STAGES * QM_BYTES;      // [stage] dO
  static constexpr int ROW_SLOTS = 2 * 2;  // row terms: [consumer warpgroup][item parity]
  static constexpr uint32_t KV_OFF_ROWS = KV_OFF_O + STAGES * QM_BYTES;
  static constexpr uint32_t KV_OFF_BAR = KV_OFF_ROWS + ROW_SLOTS * ROW_BYTES;
  static constexpr uint32_t DKDV_SMEM = KV_OFF_BAR + BAR_BYTES + 1024;  // and slack to align the base to 1024
  // dQ kernel: BR query rows per CTA, key tiles of BC keys.
  static constexpr int BR = 128, BC = D == 64 ? 128 : 64;
  static constexpr uint32_t QR_BLOCK = BR * 128, QR_BYTES = DB * QR_BLOCK;  // Q or dO of the CTA's rows
  static constexpr uint32_t KC_BLOCK = BC * 128, KC_BYTES = DB * KC_BLOCK;  // K or V of one key tile
  static constexpr uint32_t Q_OFF_O = QR_BYTES;
  static constexpr uint32_t Q_OFF_K = 2 * QR_BYTES;                    // [stage] K
  static constexpr uint32_t Q_OFF_V = Q_OFF_K + STAGES * KC_BYTES;     // [stage] V
  static constexpr uint32_t Q_OFF_BAR = Q_OFF_V + STAGES * KC_BYTES;
  static constexpr uint32_t DQ_SMEM = Q_OFF_BAR + BAR_BYTES + 1024;
  // setmaxnreg, as the forward kernel: the producer warpgroup gives registers back, the consumers take them, within
  // the pool of __launch_bounds__(384, 1) (168 per thread).
  static constexpr int REGS_PRODUCER = 24, REGS_CONSUMER = 240, REGS_ENTRY = 168;
  static_assert(128 * REGS_PRODUCER + 256 * REGS_CONSUMER <= THREADS * REGS_ENTRY, "setmaxnreg would exceed the pool");
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(BN == 2 * 64 && BR == 2 * 64, "two consumer warpgroups of 64 keys / rows");
  static_assert(BM % BOX == 0 && BN % BOX == 0 && BR % BOX == 0 && BC % BOX == 0, "tiles are whole boxes");
  static_assert(KV_BYTES % 1024 == 0 && QM_BYTES % 1024 == 0 && QR_BYTES % 1024 == 0 && KC_BYTES % 1024 == 0 &&
                    (ROW_SLOTS * ROW_BYTES) % 8 == 0,
                "tiles start on 1024-byte boundaries (the swizzle atom), barriers on 8");
  static_assert(DKDV_SMEM <= 227u * 1024u && DQ_SMEM <= 227u * 1024u, "over the sm_90 opt-in shared memory");
};

// Rows [row, row + ROWS) of one head of one batch entry, every 64-column block, into a tile at dst whose blocks are
// ROWS x 128 bytes: ROWS / 64 boxes per block (stacked boxes give the layout of one tall box: the swizzle pattern
// repeats every 8 rows). Completes DB * ROWS * 128 bytes on `bar`; rows past the map's end land as zeros.
template <int DB, int ROWS>
__device__ __forceinline__ void load_rows(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                          int tb) {
#pragma unroll
  for (int c = 0; c < DB; ++c)
#pragma unroll
    for (int h = 0; h < ROWS / 64; ++h) {
      tma_load_4d(dst + uint32_t(c * ROWS * 128 + h * 64 * 128), map, bar, c * 64, row + h * 64, head, tb);
    }
}

// Two tiles of the same rows (K and V, or Q and dO) into a and b, announced on `bar` with exactly the bytes the
// loads complete, so the count can never disagree with them.
template <int DB, int ROWS>
__device__ __forceinline__ void load_pair(uint32_t bar, uint32_t a, const CUtensorMap* map_a, uint32_t b,
                                          const CUtensorMap* map_b, int row, int head, int tb) {
  mbar_arrive_expect_tx(bar, 2u * DB * ROWS * 128u);
  load_rows<DB, ROWS>(a, map_a, bar, row, head, tb);
  load_rows<DB, ROWS>(b, map_b, bar, row, head, tb);
}

// acc (+)= A B^T over head_dim for this warpgroup's 64 rows of A: A and B K-major tiles (DB blocks of a_block /
// b_block bytes), issued (not committed). The score products: S^T = K Q^T, dP^T = V dO^T, S = Q K^T, dP = dO V^T.
template <class T, int D, int N = 64>
__device__ __forceinline__ void issue_scores(float (&acc)[N / 2], uint32_t a, uint32_t a_block, uint32_t b,
                                             uint32_t b_block) {
  // The descriptors of the k steps differ only in their address field (bits 0-13, the address / 16): offsets are
  // added to the first one (no carry: shared memory ends below 2^18 bytes), not rebuilt per step.
  const uint64_t da = smem_desc(a, 16, 1024), db = smem_desc(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col = uint32_t(kk % 4) * 32u;  // 16 columns = 32 bytes into the 128-byte row
    const uint64_t a_desc = da + ((uint32_t(kk / 4) * a_block + col) >> 4);
    const uint64_t b_desc = db + ((uint32_t(kk / 4) * b_block + col) >> 4);
    if constexpr (N == 128) {
      wgmma_ss_n128(acc, a_desc, b_desc, kk > 0 ? 1 : 0, T{});
    } else if constexpr (N == 64) {
      wgmma_ss_n64(acc, a_desc, b_desc, kk > 0 ? 1 : 0, T{});
    } else {
      static_assert(N == 16, "score products of 16, 64 or 128 keys / rows");
      wgmma_ss_n16(acc, a_desc, b_desc, kk > 0 ? 1 : 0, T{});
    }
  }
}

// acc += A B over K rows, A from registers (frag[n8 block][row half], 2 n8 blocks per k16 step, the forward's P
// layout), B an N-major tile of K rows x D (DB blocks of b_block bytes), issued (not committed). dV += P^T dO,
// dK += dS^T Q, dQ += dS K.
template <class T, int D, int K>
__device__ __forceinline__ void issue_frag_product(float (&acc)[D / 2], const uint32_t (&frag)[K / 8][2], uint32_t b,
                                                   uint32_t b_block) {
  const uint64_t db = smem_desc(b, b_block, 1024);  // + the k step's offset, as in issue_scores
#pragma unroll
  for (int kb = 0; kb < K / 16; ++kb) {
    const uint32_t a[4] = {frag[2 * kb][0], frag[2 * kb][1], frag[2 * kb + 1][0], frag[2 * kb + 1][1]};
    const uint64_t desc = db + uint32_t(kb) * 16u * 128u / 16u;
    if constexpr (D == 128) {
      wgmma_rs_n128(acc, a, desc, 1, T{});
    } else {
      wgmma_rs_n64(acc, a, desc, 1, T{});
    }
  }
}

// Rows of a 64-row accumulator (this thread's two rows g and g + 8 of its warp's 16) times `mult`, stored as pairs at
// dst + row * row_stride for the rows below `valid` (row numbers relative to dst).
template <class T, int D>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 2], float mult, T* dst, int64_t row_stride,
                                           int row0, int valid, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= valid) continue;
    T* d = dst + int64_t(row) * row_stride + 2 * t;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      *reinterpret_cast<uint32_t*>(d + dn * 8) =
          cuda::pack2<T>(acc[dn * 4 + 2 * r] * mult, acc[dn * 4 + 2 * r + 1] * mult);
    }
  }
}

// The barriers of both kernels, 8 bytes each from `bar` (BAR_BYTES): `once` (the tiles loaded once: K and V, or Q
// and dO; one arrival plus the bytes), then a ring of STAGES stages of the tiles loaded per step, `full` (one arrival
// plus the bytes) and `empty` (one arrival per consumer warp).
template <int STAGES>
struct Barriers {
  uint32_t bar;
  __device__ __forceinline__ uint32_t once() const { return bar; }
  __device__ __forceinline__ uint32_t full(int st) const { return bar + 8u + 8u * uint32_t(st); }
  __device__ __forceinline__ uint32_t empty(int st) const { return bar + 8u + 8u * uint32_t(STAGES + st); }
  // By thread 0, before the CTA's first __syncthreads.
  __device__ __forceinline__ void init() const {
    mbar_init(once(), 1);
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), 8);
    }
    mbar_init_fence();
  }
  // Thread 0 initialises them, then the CTA synchronises, so that no thread uses a barrier before its init.
  __device__ __forceinline__ void init_and_sync() const {
    if (threadIdx.x == 0) init();
    __syncthreads();
  }
  // By the producer thread: the stage of its n-th ring item, once the consumers have released it (a fresh barrier
  // passes parity 1).
  __device__ __forceinline__ int claim(int n) const {
    const int st = n % STAGES;
    cuda::mbar_wait_or_trap(empty(st), uint32_t((n / STAGES) & 1) ^ 1u);
    return st;
  }
};

// The first 1024-aligned byte of the dynamic shared memory (the 128-byte swizzle repeats every 1024 bytes; the
// launch asks for 1024 bytes of slack).
__device__ __forceinline__ unsigned char* aligned_smem() {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = cuda::smem_addr(smem_raw);
  return smem_raw + (((raw + 1023u) & ~1023u) - raw);
}

// A CTA's place in the grid (cuda_bwd::grid_place) and its sequence.
struct CtaPlace {
  int tile, head, batch;
  cuda_bwd::SeqInfo s;
};
__device__ __forceinline__ CtaPlace cta_place(const BwdParams& p, int tiles, int heads, bool lead) {
  const GridPlace g = cuda_bwd::grid_place(tiles, heads, lead);
  return {g.tile, g.head, g.batch, cuda_bwd::seq_info(p, g.batch)};
}

// The producer warpgroup of both kernels: it gives its registers back; its first thread loads the CTA's resident pair
// (K and V for dK / dV, Q and dO for dQ: ROWS rows from `row` of `head`) on the `once` barrier, then runs `ring`,
// which streams the other pair through the ring's stages.
template <int REGS, int DB, int ROWS, int STAGES, class Ring>
__device__ __forceinline__ void run_producer(const HopperBwdParams& hp, const Barriers<STAGES>& bars, uint32_t a,
                                             const CUtensorMap* map_a, uint32_t b, const CUtensorMap* map_b, int row,
                                             int head, int tb, Ring&& ring) {
  regs_dealloc<REGS>();
  if (threadIdx.x != 0) return;
  tma_prefetch_map(&hp.tq);
  tma_prefetch_map(&hp.tk);
  tma_prefetch_map(&hp.tv);
  tma_prefetch_map(&hp.tdo);
  load_pair<DB, ROWS>(bars.once(), a, map_a, b, map_b, row, head, tb);
  ring();
}

// Zeroes rows [r0, ROWS) of a DB-block tile at `tile` (blocks ROWS x 128 bytes; the 128-byte swizzle only permutes
// the 16-byte chunks within a row, so a row keeps its 128 bytes) by the 256 consumer threads (ct: 0..255), fenced
// into the async proxy that wgmma reads through. The caller's named barrier then orders it before every wgmma.
template <int DB, int ROWS>
__device__ __forceinline__ void zero_tail(uint32_t tile, int r0, int ct) {
#pragma unroll 1  // rare: small, off the hot loop
  for (int i = r0 * 8 + ct; i < ROWS * 8; i += 256) {  // 16-byte chunk i of each block
#pragma unroll
    for (int c = 0; c < DB; ++c) cuda_fwd_hopper::st_shared_zero16(tile + uint32_t(c * ROWS * 128) + uint32_t(i) * 16u);
  }
  cuda_fwd_hopper::fence_proxy_async_smem();
}

// ------------------------------------------------------------------ dK, dV

template <class T, int D>
__global__ void __launch_bounds__(384, 1) bwd_hopper_dkdv_kernel(const __grid_constant__ HopperBwdParams hp) {
  using Cfg = BwdHopperTile<D>;
  constexpr int BN = Cfg::BN, BM = Cfg::BM, DB = Cfg::DB, STAGES = Cfg::STAGES;
  constexpr int NB = BM / 8;  // n8 blocks of S^T over the q rows
  const BwdParams& p = hp.b;

  const CtaPlace place = cta_place(p, hp.key_blocks, p.kv_heads, p.sink_block_first);
  const cuda_bwd::SeqInfo& s = place.s;
  const int kvh = place.head, b = place.batch, j0 = place.tile * BN;
  if (j0 >= s.sk) return;  // uniform over the CTA
  const int j1 = min(j0 + BN, s.sk);

  // Work items: (q head of the group, q block) pairs over the q blocks that see these keys (qr: exactly those, from
  // the mask; tests/mask checks it), in order; the producer and the consumers walk the same list.
  const BlockRange qr = q_blocks_seeing_keys(p.mask, j0, j1, s.sq, s.sk, BM);
  const int items = p.group * (qr.end - qr.begin);
  const auto item_at = [&](int x) { return cuda_bwd::q_item(x, qr, p.group, BM); };

  // Shared memory (base aligned to 1024): K | V | Q[STAGES] | dO[STAGES] | row terms[2][2] | barriers.
  unsigned char* const smem = aligned_smem();
  const uint32_t base = cuda::smem_addr(smem);
  const uint32_t sK = base, sV = base + Cfg::KV_OFF_V;
  const auto sQ = [&](int st) { return base + Cfg::KV_OFF_Q + uint32_t(st) * Cfg::QM_BYTES; };
  const auto sO = [&](int st) { return base + Cfg::KV_OFF_O + uint32_t(st) * Cfg::QM_BYTES; };
  const auto rows = [&](int wg, int slot) {
    return reinterpret_cast<float*>(smem + Cfg::KV_OFF_ROWS + uint32_t(2 * wg + slot) * Cfg::ROW_BYTES);
  };
  const Barriers<STAGES> bars{base + Cfg::KV_OFF_BAR};  // once: K and V; the ring (full / empty): Q and dO of each item
  bars.init_and_sync();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

  if (warp < 4) {
    // ------------------------------------------------ producer warpgroup: K and V once, then Q and dO per item
    const int tb = int(s.tb);
    run_producer<Cfg::REGS_PRODUCER, DB, BN>(hp, bars, sK, &hp.tk, sV, &hp.tv, int(s.k_row0) + j0, kvh, tb, [&] {
      for (int n = 0; n < items; ++n) {
        const cuda_bwd::QItem it = item_at(n);
        const int h = kvh * p.group + it.hg, row = int(s.q_row0) + it.i0;
        const int st = bars.claim(n);
        load_pair<DB, BM>(bars.full(st), sQ(st), &hp.tq, sO(st), &hp.tdo, row, h, tb);
      }
      // The last items' releases (idle time): a consumer stuck on one of them traps here instead of hanging.
      for (int k = items > STAGES ? items - STAGES : 0; k < items; ++k) {
        cuda::mbar_wait_or_trap(bars.empty(k % STAGES), uint32_t((k / STAGES) & 1));
      }
    });
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    regs_alloc<Cfg::REGS_CONSUMER>();
    // keys [64 cw, 64 cw + 64) of the block (broadcast from lane 0, so the compiler knows it is warp-uniform and
    // keeps the wgmma descriptors built from it in uniform registers)
    const int cw = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int g = lane / 4, t = lane % 4;
    const int ct = int(threadIdx.x) - 128;        // consumer thread 0..255
    const int kw = cw * 64 + (warp % 4) * 16;     // this warp's first key within the block
    const uint32_t k_wg = sK + uint32_t(cw) * 64u * 128u, v_wg = sV + uint32_t(cw) * 64u * 128u;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    // The row terms: each consumer warpgroup keeps its own copy (its threads wt < BM, one q row each), so that the
    // two synchronise only within themselves; the LSE and D of a row are loaded an item ahead (`load_raw`), so their
    // latency hides behind a whole item, and written into the slot of the item's parity (`write_rows`).
    const int wt = ct - 128 * cw;  // thread within the warpgroup
    struct RowRaw {
      float L = 0.f, d = 0.f;
    };
    const auto load_raw = [&](int x) {
      RowRaw raw;
      if (wt >= BM || x >= items) return raw;
      const cuda_bwd::QItem it = item_at(x);
      const int i = it.i0 + wt;
      if (i < s.sq) {
        const int h = kvh * p.group + it.hg;
        raw.L = p.lse[s.tb * p.lse_stride.batch + int64_t(h) * p.lse_stride.head + (s.q_row0 + i) * p.lse_stride.seq];
        raw.d = p.delta[(s.tb * p.q_heads + h) * p.rows_q + s.q_row0 + i];
      }
      return raw;
    };
    const auto write_rows = [&](int x, const RowRaw& raw, int slot) {
      if (wt >= BM) return;
      const cuda_bwd::RowTerms rt = cuda_bwd::row_terms_of(p, s, item_at(x).i0 + wt, raw.L, raw.d);
      float* r = rows(cw, slot);
      int* ri = reinterpret_cast<int*>(r + 2 * BM);
      r[wt] = rt.l2, r[BM + wt] = rt.d, ri[wt] = rt.lo, ri[BM + wt] = rt.hi, ri[2 * BM + wt] = rt.se;
    };

    // Varlen, except the last sequence (past the map's end TMA zero-fills): q blocks crossing the sequence's end.
    const bool q_tails = p.cu_q != nullptr && b + 1 < p.batch;
    // The q blocks that see this warpgroup's 64 keys, a sub-range of qr: under sink tokens key block 0's first half
    // (the sinks) is seen by every q block and its second half only by the window's, so on the other items the
    // second warpgroup has nothing to add and leaves the tensor cores to the first.
    const int jw0 = min(j0 + 64 * cw, j1), jw1 = min(j0 + 64 * cw + 64, j1);
    const BlockRange mine = jw0 < jw1 ? q_blocks_seeing_keys(p.mask, jw0, jw1, s.sq, s.sk, BM) : BlockRange{0, 0};
    float sct[BM / 2], dpt[BM / 2];  // S^T and dP^T: this warp's 16 keys x the block's BM q rows
    uint32_t pk[NB][2], dsk[NB][2];  // P^T and dS^T packed to 16 bits as A fragments (rows: keys; columns: q rows)

    // Per item n, overlapped within the warpgroup: S^T and dP^T are issued as two commit groups (they complete in
    // order), P^T is formed while dP^T runs, then dV += P^T dO is issued and dS^T formed while it runs. Each item
    // ends with nothing in flight: a product still running across the loop's back edge makes ptxas serialise every
    // wgmma, and the register budget (dK, dV, S^T, dP^T, P^T, dS^T: 224 of 240) has no room for the forward kernel's
    // way around that (the previous item's last product issued with this item's first two).
    if (items > 0) write_rows(0, load_raw(0), 0);
    RowRaw raw_next = load_raw(1);
    cuda::mbar_wait_or_trap(bars.once(), 0);
    for (int n = 0; n < items; ++n) {
      const int st = n % STAGES;
      const int i0 = item_at(n).i0, i1 = min(i0 + BM, s.sq);
      // (the plain wait here: the trapping one costs this register-tight loop spills at d128; a hang here still
      // traps in the producer, which waits for every item's release)
      cuda_fwd_hopper::mbar_wait(bars.full(st), uint32_t((n / STAGES) & 1));
      if (q_tails && i0 + BM > s.sq) {  // varlen: the next sequence's rows in this block (uniform over the CTA)
        zero_tail<DB, BM>(sQ(st), s.sq - i0, ct);
        zero_tail<DB, BM>(sO(st), s.sq - i0, ct);
        named_sync(1, 256);
      }
      // This item's row terms are written (last iteration, or before the loop) and every thread of the warpgroup
      // is done with the previous item's, whose slot is rewritten below.
      named_sync(2 + cw, 128);
      const float* terms = rows(cw, n & 1);
      if (i0 / BM < mine.begin || i0 / BM >= mine.end) {  // none of this warpgroup's keys visible (uniform over it)
        if (n + 1 < items) write_rows(n + 1, raw_next, (n + 1) & 1);
        raw_next = load_raw(n + 2);
        if (lane == 0) mbar_arrive(bars.empty(st));
        continue;
      }

      wgmma_fence();
      issue_scores<T, D, BM>(sct, k_wg, Cfg::KV_BLOCK, sQ(st), Cfg::QM_BLOCK);
      wgmma_commit();
      issue_scores<T, D, BM>(dpt, v_wg, Cfg::KV_BLOCK, sO(st), Cfg::QM_BLOCK);
      wgmma_commit();
      if (n + 1 < items) write_rows(n + 1, raw_next, (n + 1) & 1);  // while the products run
      raw_next = load_raw(n + 2);

      const bool full = i1 - i0 == BM && j1 - j0 == BN && tile_fully_visible(p.mask, i0, i1, j0, j1, s.sq, s.sk);
      if constexpr (BM == 64) {
        wgmma_wait<1>();  // S^T
        pin_regs(sct);
        cuda_bwd::probs_transposed_tile<T, BM, NB>(pk, p, terms, j0 + kw + g, 2 * t, full, sct);
        wgmma_fence();
        issue_frag_product<T, D, BM>(dv, pk, sO(st), Cfg::QM_BLOCK);  // dV += P^T dO
        wgmma_commit();

        wgmma_wait<1>();  // dP^T
        pin_regs(dpt);
        cuda_bwd::grads_transposed_tile<T, BM, NB>(dsk, terms, 2 * t, full, sct, dpt);
        wgmma_fence();
        issue_frag_product<T, D, BM>(dk, dsk, sQ(st), Cfg::QM_BLOCK);  // dK += dS^T Q
        wgmma_commit();
      } else {  // 128 q rows: S^T and dP^T (64 registers each) are spent before dV and dK run, as 240 registers hold
        wgmma_wait<0>();
        pin_regs(sct);
        pin_regs(dpt);
        cuda_bwd::probs_grads_transposed_tile<T, BM, NB>(pk, dsk, p, terms, j0 + kw + g, 2 * t, full, sct, dpt);
        wgmma_fence();
        issue_frag_product<T, D, BM>(dv, pk, sO(st), Cfg::QM_BLOCK);  // dV += P^T dO
        issue_frag_product<T, D, BM>(dk, dsk, sQ(st), Cfg::QM_BLOCK);  // dK += dS^T Q
        wgmma_commit();
      }
      wgmma_wait<0>();
      pin_regs(dv);
      pin_regs(dk);
      pin_regs(pk);
      pin_regs(dsk);
      if (lane == 0) mbar_arrive(bars.empty(st));
    }

    // Epilogue: dK (times scale) and dV of this thread's keys, straight from registers.
    T* dkg = static_cast<T*>(p.dk) + p.dk_stride.offset(s.tb, s.k_row0 + j0, kvh);
    T* dvg = static_cast<T*>(p.dv) + p.dv_stride.offset(s.tb, s.k_row0 + j0, kvh);
    store_rows<T, D>(dk, p.scale, dkg, p.dk_stride.seq, kw, j1 - j0, g, t);
    store_rows<T, D>(dv, 1.f, dvg, p.dv_stride.seq, kw, j1 - j0, g, t);
  }
}

// ------------------------------------------------------------------ dQ and dsink

template <class T, int D>
__global__ void __launch_bounds__(384, 1) bwd_hopper_dq_kernel(const __grid_constant__ HopperBwdParams hp) {
  using Cfg = BwdHopperTile<D>;
  constexpr int BR = Cfg::BR, BC = Cfg::BC, DB = Cfg::DB, STAGES = Cfg::STAGES;
  constexpr int kSinkKeys = 16;  // the narrow sink tile's keys: wgmma's n16 for S and dP, one k16 step for dQ
  const BwdParams& p = hp.b;

  const CtaPlace place = cta_place(p, hp.row_blocks, p.q_heads, false);
  const cuda_bwd::SeqInfo& s = place.s;
  // Heaviest row blocks first (under a causal mask the last rows see the most keys), so the last wave is short.
  const int h = place.head, b = place.batch, qt = hp.row_blocks - 1 - place.tile, i0 = qt * BR;
  if (i0 >= s.sq) {  // uniform (padded batches: never); varlen: a shorter sequence's tiles, whose dsink shares are 0
    if (p.dsink_part && threadIdx.x < 2 && qt * 2 + int(threadIdx.x) < p.q_tiles) {
      p.dsink_part[(int64_t(b) * p.q_heads + h) * p.q_tiles + qt * 2 + threadIdx.x] = 0.f;
    }
    return;
  }
  const int i1 = min(i0 + BR, s.sq);
  const int kvh = h / p.group;
  const cuda_fwd::KeyTiles ktl = cuda_fwd::key_tiles(p.mask, i0, i1, s.sq, s.sk, BC);

  // Shared memory (base aligned to 1024): Q | dO | K[STAGES] | V[STAGES] | barriers.
  const uint32_t base = cuda::smem_addr(aligned_smem());
  const uint32_t sQ = base, sO = base + Cfg::Q_OFF_O;
  const auto sK = [&](int st) { return base + Cfg::Q_OFF_K + uint32_t(st) * Cfg::KC_BYTES; };
  const auto sV = [&](int st) { return base + Cfg::Q_OFF_V + uint32_t(st) * Cfg::KC_BYTES; };
  // once: Q and dO; the ring (full / empty): K and V of each key tile
  const Barriers<STAGES> bars{base + Cfg::Q_OFF_BAR};
  bars.init_and_sync();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

  if (warp < 4) {
    // ------------------------------------------- producer warpgroup: Q and dO once, then K and V per key tile
    const int tb = int(s.tb);
    run_producer<Cfg::REGS_PRODUCER, DB, BR>(hp, bars, sQ, &hp.tq, sO, &hp.tdo, int(s.q_row0) + i0, h, tb, [&] {
      for (int n = 0; n < ktl.count; ++n) {
        const int krow = int(s.k_row0) + ktl.tile(n) * BC;
        const int st = bars.claim(n);
        load_pair<DB, BC>(bars.full(st), sK(st), &hp.tk, sV(st), &hp.tv, krow, kvh, tb);
      }
      // The last tiles' releases (idle time): a consumer stuck on one of them traps here instead of hanging.
      for (int k = ktl.count > STAGES ? ktl.count - STAGES : 0; k < ktl.count; ++k) {
        cuda::mbar_wait_or_trap(bars.empty(k % STAGES), uint32_t((k / STAGES) & 1));
      }
    });
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    regs_alloc<Cfg::REGS_CONSUMER>();
    const int cw = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);  // rows [64 cw, 64 cw + 64) of the CTA's (as above)
    const int g = lane / 4, t = lane % 4;
    const int row_w = cw * 64 + (warp % 4) * 16;  // this warp's first row within the CTA's
    const int wr0 = i0 + row_w, wr1 = min(wr0 + 16, s.sq);
    const uint32_t q_wg = sQ + uint32_t(cw) * 64u * 128u, o_wg = sO + uint32_t(cw) * 64u * 128u;
    const int ct = int(threadIdx.x) - 128;  // consumer thread 0..255
    // Varlen, except the last sequence: the key tile that crosses the sequence's end (-1: none).
    const int k_tail = p.cu_q != nullptr && b + 1 < p.batch && s.sk % BC != 0 ? s.sk / BC : -1;
    const float* lse = p.lse + s.tb * p.lse_stride.batch + int64_t(h) * p.lse_stride.head;
    const float* delta = p.delta + (s.tb * p.q_heads + h) * p.rows_q + s.q_row0;
    cuda_bwd::RowTerms rt[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) rt[r] = cuda_bwd::row_terms(p, s, lse, delta, wr0 + g + 8 * r);

    float dq[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;

    // The keys this warpgroup's 64 rows may see: a tile of the CTA's walk that holds none of them is skipped (as the
    // dK / dV kernel skips q blocks), so at a window's two edges each warpgroup walks one tile fewer than the CTA. A
    // sink tile whose keys past the first kSinkKeys the rows do not see (past the window: sink tokens alone) takes
    // products over those keys only, n16 instead of the tile's BC.
    const RowsKeys wk = rows_keys(p.mask, i0 + 64 * cw, min(i0 + 64 * cw + 64, s.sq), s.sq, s.sk);
    const bool narrow_sink = ktl.n_sink == 1 && !wk.may_see(kSinkKeys, BC);

    // One key tile, overlapped within the warpgroup: S and dP are issued as two commit groups (they complete in
    // order) and P is formed while dP runs. Each tile ends with nothing in flight, as in the dK / dV kernel: the
    // forward kernel's way of overlapping further (the previous tile's dQ product issued with this tile's scores)
    // left ptxas short of registers for the wgmma pipeline at d128, and it serialised every wgmma. NK: the keys the
    // products take: BC, the first 64 of a 128-key tile (rows that see none of the rest), or the narrow sink tile's
    // kSinkKeys.
    const auto tile_step = [&]<int NK>(int st, int j0, int j1) {
      float sc[NK / 2], dp[NK / 2];  // S and dP: this warp's 16 rows x the tile's NK keys
      uint32_t dsk[NK / 8][2];       // dS packed to 16 bits as the A fragment (rows: this warp's q rows; columns: keys)
      wgmma_fence();
      issue_scores<T, D, NK>(sc, q_wg, Cfg::QR_BLOCK, sK(st), Cfg::KC_BLOCK);
      wgmma_commit();
      issue_scores<T, D, NK>(dp, o_wg, Cfg::QR_BLOCK, sV(st), Cfg::KC_BLOCK);
      wgmma_commit();
      const bool full = NK == BC && wr1 - wr0 == 16 && j1 - j0 == BC &&
                        tile_fully_visible(p.mask, wr0, wr1, j0, j1, s.sq, s.sk);
      if constexpr (NK != 128) {
        wgmma_wait<1>();  // S
        pin_regs(sc);
        cuda_bwd::probs_tile<NK / 8>(p, rt, j0 + 2 * t, full, sc);
        wgmma_wait<0>();  // dP
        pin_regs(dp);
        cuda_bwd::grads_tile<T, NK / 8>(dsk, rt, full, sc, dp);
      } else {  // 128 keys: both products land before P and dS are formed (dS fills as S and dP are spent)
        wgmma_wait<0>();
        pin_regs(sc);
        pin_regs(dp);
        cuda_bwd::probs_tile<NK / 8>(p, rt, j0 + 2 * t, full, sc);
        cuda_bwd::grads_tile<T, NK / 8>(dsk, rt, full, sc, dp);
      }
      wgmma_fence();
      issue_frag_product<T, D, NK>(dq, dsk, sK(st), Cfg::KC_BLOCK);  // dQ += dS K
      wgmma_commit();
      wgmma_wait<0>();
      pin_regs(dq);
      pin_regs(dsk);
    };

    cuda::mbar_wait_or_trap(bars.once(), 0);
    for (int n = 0; n < ktl.count; ++n) {
      const int st = n % STAGES;
      const int j0 = ktl.tile(n) * BC, j1 = min(j0 + BC, s.sk);
      // (the plain wait, as in the dK / dV kernel: the trapping one's exit path, which the producer shares, keeps
      // ptxas from giving this loop the consumers' 240 registers at 128 keys; a hang here still traps in the
      // producer, which waits for every tile's release. A warpgroup that skips the tile waits too: its release then
      // cannot count towards an earlier use of the stage.)
      cuda_fwd_hopper::mbar_wait(bars.full(st), uint32_t((n / STAGES) & 1));
      if (__builtin_expect(ktl.tile(n) == k_tail, 0)) {  // both warpgroups visit the same tiles: both reach the barrier
        zero_tail<DB, BC>(sK(st), s.sk - j0, ct);
        named_sync(1, 256);
      }
      if (!wk.may_see(j0, j1)) {
        // none of this warpgroup's rows sees the tile's keys (uniform over it)
      } else if (n == 0 && narrow_sink) {
        tile_step.template operator()<kSinkKeys>(st, j0, j1);
      } else if (BC == 128 && !wk.may_see(j0 + 64, j1)) {  // rows that see only the tile's first 64 keys (a causal
        tile_step.template operator()<64>(st, j0, j1);      // diagonal, a right window edge): n64 products
      } else {
        tile_step.template operator()<BC>(st, j0, j1);
      }
      if (lane == 0) mbar_arrive(bars.empty(st));
    }

    // Epilogue: dQ (times scale) straight from registers; this warpgroup's 64 rows' dsink share, in row order, into
    // the slot of their 64-row tile (the mma.sync dQ kernel's tiles: kBlockM = 64).
    T* dqg = static_cast<T*>(p.dq) + p.dq_stride.offset(s.tb, s.q_row0 + i0, h);
    store_rows<T, D>(dq, p.scale, dqg, p.dq_stride.seq, row_w, i1 - i0, g, t);
    const int tile64 = qt * 2 + cw;
    if (p.dsink_part && warp % 4 == 0 && lane == 0 && tile64 < p.q_tiles) {
      const float sink = p.sink_logits[h];
      float sum = 0.f;
      for (int r = 0; r < 64; ++r) {
        const int i = tile64 * 64 + r;
        sum += i < s.sq && sink != -INFINITY ? -expf(sink - lse[(s.q_row0 + i) * p.lse_stride.seq]) * delta[i] : 0.f;
      }
      p.dsink_part[(int64_t(b) * p.q_heads + h) * p.q_tiles + tile64] = sum;
    }
  }
}

// Launches both kernels of one instantiation (dK/dV, then dQ) on `stream`. Instantiated once per variant file
// (bwd_hopper_<dtype>_d<D>.cu); launch_bwd_hopper.cu only refers to them. Returns the launch error, if any.
template <class T, int D>
cudaError_t launch_bwd_hopper_variant(const HopperBwdParams& hp, cudaStream_t stream) {
  using Cfg = BwdHopperTile<D>;
  static ::flashlite::cuda::PerContextFlag dkdv_optin, dq_optin;
  cuda_fwd::ensure_smem_optin(bwd_hopper_dkdv_kernel<T, D>, int(Cfg::DKDV_SMEM), dkdv_optin);
  cuda_fwd::ensure_smem_optin(bwd_hopper_dq_kernel<T, D>, int(Cfg::DQ_SMEM), dq_optin);
  const int64_t kv_blocks = int64_t(hp.key_blocks) * hp.b.kv_heads * hp.b.batch;
  if (kv_blocks > 0) {
    bwd_hopper_dkdv_kernel<T, D><<<unsigned(kv_blocks), Cfg::THREADS, Cfg::DKDV_SMEM, stream>>>(hp);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int64_t q_blocks = int64_t(hp.row_blocks) * hp.b.q_heads * hp.b.batch;
  if (q_blocks > 0) bwd_hopper_dq_kernel<T, D><<<unsigned(q_blocks), Cfg::THREADS, Cfg::DQ_SMEM, stream>>>(hp);
  return cudaGetLastError();
}

#define FL_BWD_HOPPER_VARIANTS(X) \
  X(__nv_bfloat16, 64)            \
  X(__nv_bfloat16, 128)           \
  X(__half, 64)                   \
  X(__half, 128)

#define FL_BWD_HOPPER_EXTERN(T, D) \
  extern template cudaError_t launch_bwd_hopper_variant<T, D>(const HopperBwdParams&, cudaStream_t);
FL_BWD_HOPPER_VARIANTS(FL_BWD_HOPPER_EXTERN)
#undef FL_BWD_HOPPER_EXTERN

}  // namespace flashlite::cuda_bwd_hopper
