#pragma once
// The CUDA backward on tensor cores (FlashAttention-2's backward), fp16 / bf16, sm_80 and newer (mma.sync m16n8k16,
// fp32 accumulation). Four steps on one stream, no atomics anywhere, so every run gives the same bits:
//
//   bwd_delta_kernel  D_i = dout_i . out_i (fp32; less dlse_i when given), 8 to 32 threads per (tensor row, q head)
//                     reading 16-byte chunks, into the workspace
//   bwd_dkdv_kernel   one block per (sequence, kv head, key block of kBlockN keys): K and V of the block in shared
//                     memory; for every q head of the GQA group and every q block that can see the keys (q blocks the
//                     mask hides are skipped), Q, dO, L and D of the q block into shared memory (two stages: the
//                     next q block's copies fly while this one is computed), then per warp (16 keys):
//                     S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T scale log2e - L log2e) (softcap through the tanh),
//                     dS^T = P^T (dP^T - D) (times 1 - tanh^2), dV += P^T dO, dK += dS^T Q; dK scaled once at the end
//   bwd_dq_kernel     one block per (sequence, q head, q block of kBlockM rows): Q and dO in shared memory, the key
//                     blocks it sees (KeyTiles, as the forward) through two K/V stages, the same recompute per warp
//                     (16 rows), dQ += dS K; and the block's share of dsink = -sum_i exp(sink_h - L_i) D_i into its
//                     workspace slot
//   bwd_dsink_kernel  (launch.cu) per q head, the slots summed in a fixed order (float64) into dsink_logits
//
// Masked entries (and rows / keys past a sequence, which are zero-filled in shared memory and never read from
// global memory) get P = 0 and dS = 0; a row with LSE -inf (no visible key, no sink) gets P = 0.
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/bwd/bwd_common.cuh"
#include "cuda/bwd/bwd_params.h"
#include "cuda/common/dtype.cuh"
#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/fwd_mma.cuh"  // load_tile
#include "cuda/fwd/row_mask.h"

namespace flashlite::cuda_bwd {

using cuda_fwd::KeyTiles;

template <int D_>
struct BwdTile {
  static constexpr int D = D_, BM = kBlockM, BN = kBlockN, WARPS = kWarps;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int LD = D + 8;   // smem row stride (elements): 16-byte pad, conflict-free ldmatrix
  static constexpr int CPR = D / 8;  // 16-byte chunks per row (load_tile's contract)
  static constexpr int KD = D / 16;  // k16 steps over head_dim
  static constexpr int ND = D / 8;   // n8 tiles over head_dim
  static constexpr int TILE_M_BYTES = BM * LD * 2;
  static constexpr int TILE_N_BYTES = BN * LD * 2;
  // Per query row of a dK/dV stage: L log2e, D, the visible key interval (lo, hi, sink end).
  static constexpr int ROW_BYTES = BM * 5 * 4;
  // dK/dV kernel: K, V, two stages of [Q, dO] and of the row terms. dQ kernel: Q, dO, two stages of [K, V], the
  // dsink terms of the rows.
  static constexpr int SMEM_DKDV = 2 * TILE_N_BYTES + 4 * TILE_M_BYTES + 2 * ROW_BYTES;
  static constexpr int SMEM_DQ = 2 * TILE_M_BYTES + 4 * TILE_N_BYTES + BM * 4;
  static_assert(BM == WARPS * 16 && BN == WARPS * 16, "each warp owns 16 rows of its tile");
  static_assert(D % 16 == 0, "head_dim is a multiple of 16");
};

// Both kernels' shared memory: the pair of tiles the block keeps throughout (FIXED bytes each), a two-stage ring of
// the pairs it streams (RING bytes each, a stage holding one pair), then fp32 terms.
template <int FIXED, int RING>
struct PairLayout {
  uint32_t first;  // shared-window address of the first fixed tile
  float* terms;
  __device__ __forceinline__ explicit PairLayout(unsigned char* smem)
      : first(cuda_fwd::smem_addr(smem)), terms(reinterpret_cast<float*>(smem + 2 * FIXED + 4 * RING)) {}
  __device__ __forceinline__ uint32_t second() const { return first + FIXED; }
  __device__ __forceinline__ uint32_t ring(int st) const { return first + 2 * FIXED + uint32_t(st) * 2 * RING; }
};

// One k16 step of two products over a pair of n8 tiles: c1[n], c1[n + 1] += a1 B1 and c2[n], c2[n + 1] += a2 B2, with
// B1 and B2 the x4 fragments at sB1 + off and sB2 + off (ldmatrix, or ldmatrix.trans for TRANS).
template <class T, bool TRANS, int N>
__device__ __forceinline__ void mma_pair_n16(float (&c1)[N][4], float (&c2)[N][4], int n, const uint32_t (&a1)[4],
                                             const uint32_t (&a2)[4], uint32_t sB1, uint32_t sB2, uint32_t off) {
  uint32_t b1[4], b2[4];
  if constexpr (TRANS) {
    cuda_fwd::ldmatrix_x4_trans(b1, sB1 + off);
    cuda_fwd::ldmatrix_x4_trans(b2, sB2 + off);
  } else {
    cuda_fwd::ldmatrix_x4(b1, sB1 + off);
    cuda_fwd::ldmatrix_x4(b2, sB2 + off);
  }
  cuda_fwd::mma_16816<T>(c1[n], a1, b1[0], b1[1]);
  cuda_fwd::mma_16816<T>(c1[n + 1], a1, b1[2], b1[3]);
  cuda_fwd::mma_16816<T>(c2[n], a2, b2[0], b2[1]);
  cuda_fwd::mma_16816<T>(c2[n + 1], a2, b2[2], b2[3]);
}

// Both kernels' pair of products over head_dim, this warp's 16 rows (from row w of the A tiles) x NT n8 tiles (rows
// of the B tiles): c1 = A1 B1^T and c2 = A2 B2^T, zeroed first. dK/dV: S^T = K Q^T and dP^T = V dO^T; dQ: S = Q K^T
// and dP = dO V^T. a_off / b_off: this lane's ldmatrix offsets (bytes).
template <class T, class Cfg, int NT>
__device__ __forceinline__ void warp_mma_pair(float (&c1)[NT][4], float (&c2)[NT][4], uint32_t sA1, uint32_t sA2,
                                              uint32_t sB1, uint32_t sB2, int w, uint32_t a_off, uint32_t b_off) {
  constexpr int LD = Cfg::LD;
#pragma unroll
  for (int nj = 0; nj < NT; ++nj)
#pragma unroll
    for (int e = 0; e < 4; ++e) c1[nj][e] = c2[nj][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Cfg::KD; ++kk) {
    uint32_t a1[4], a2[4];
    const uint32_t a = a_off + uint32_t((w * LD + kk * 16) * 2);
    cuda_fwd::ldmatrix_x4(a1, sA1 + a);
    cuda_fwd::ldmatrix_x4(a2, sA2 + a);
#pragma unroll
    for (int nj = 0; nj < NT; nj += 2) {
      mma_pair_n16<T, false>(c1, c2, nj, a1, a2, sB1, sB2, b_off + uint32_t((nj * 8 * LD + kk * 16) * 2));
    }
  }
}

// Rows [row0, row0 + ROWS) of an smem tile (stride Cfg::LD) to global memory (row stride row_stride from g); rows at
// or past `valid` are not written.
template <class Cfg, int ROWS, class T>
__device__ __forceinline__ void store_tile(const T* s, T* g, int64_t row_stride, int row0, int valid, bool vec) {
  constexpr int CPR = Cfg::CPR, LD = Cfg::LD, CHUNKS = ROWS * CPR;
  for (int c = int(threadIdx.x); c < CHUNKS; c += Cfg::THREADS) {
    const int r = c / CPR, ch = c % CPR;
    if (row0 + r >= valid) continue;
    const uint4 val = *reinterpret_cast<const uint4*>(s + r * LD + ch * 8);
    T* dst = g + int64_t(row0 + r) * row_stride + ch * 8;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = val;
    } else {
      const unsigned short* h = reinterpret_cast<const unsigned short*>(&val);
#pragma unroll
      for (int e = 0; e < 8; ++e) reinterpret_cast<unsigned short*>(dst)[e] = h[e];
    }
  }
}

// An accumulator tile (16 rows per warp, ND n8 tiles, fp32) times `mult`, rounded to T into smem rows
// [row0, row0 + 16) of a tile with stride LD.
template <class T, int ND, int LD>
__device__ __forceinline__ void stage_acc(T* s, const float (&acc)[ND][4], float mult, int row0, int g, int t) {
#pragma unroll
  for (int dn = 0; dn < ND; ++dn)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(s + (row0 + g + 8 * r) * LD + dn * 8 + 2 * t) =
          cuda_fwd::pack2<T>(acc[dn][2 * r] * mult, acc[dn][2 * r + 1] * mult);
    }
}

// Per-lane element offsets of the ldmatrix x4 addresses (m16n8k16 fragment layouts, as in fwd_mma.cuh):
//   A operand from a row-major [m][k] tile, and B operand from a row-major [k][n] tile with .trans (two n8 tiles):
//     rows (lane/8 % 2)*8 + lane%8, columns (lane/16)*8
//   B operand from a row-major [n][k] tile (two n8 tiles): rows (lane/16)*8 + lane%8, columns (lane/8 % 2)*8
__device__ __forceinline__ int lane_a(int lane, int ld) { return ((lane / 8 % 2) * 8 + lane % 8) * ld + (lane / 16) * 8; }
__device__ __forceinline__ int lane_b(int lane, int ld) { return ((lane / 16) * 8 + lane % 8) * ld + (lane / 8 % 2) * 8; }

// ------------------------------------------------------------------ D = dout . out

// Eight 2-byte elements of a and b (one 16-byte load each) multiplied and summed in fp32.
__device__ __forceinline__ float2 pair_as_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 pair_as_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
template <class T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const T2* x = reinterpret_cast<const T2*>(&a);
  const T2* y = reinterpret_cast<const T2*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 u = pair_as_float2(x[i]), w = pair_as_float2(y[i]);
    s += u.x * w.x + u.y * w.y;
  }
  return s;
}

// `lanes` threads (a power of two, at most 32) per (tensor row, q head) item, kDeltaRows items per group of lanes: a
// block's 256 / lanes groups take consecutive items, then the next 256 / lanes, so a warp still reads whole rows and
// a thread has kDeltaRows loads in flight. kVec: every row of out and dout is 16-byte aligned, and each thread
// reads 16-byte chunks (one element per lane left the kernel latency-bound at 5x its bytes' time on the H100 at
// head_dim 64). Index: uint32_t when the items fit, so that splitting an item into (tensor batch, row, head) costs two
// 32-bit divisions instead of 64-bit ones (with one item per thread those had made the kernel issue-bound: 3.0 TB/s
// on the H200).
constexpr int kDeltaRows = 4;
template <class T, bool kVec, class Index>
__global__ void bwd_delta_kernel(const __grid_constant__ BwdParams p, int lanes) {
  const Index groups = Index(blockDim.x) / Index(lanes);
  const Index first = Index(blockIdx.x) * groups * kDeltaRows + Index(threadIdx.x) / Index(lanes);
  const int sub = int(threadIdx.x) % lanes;
  const Index total = Index(p.tensor_batch) * Index(p.rows_q) * Index(p.q_heads);
  float acc[kDeltaRows];
  Index items[kDeltaRows];
  uint4 oc[kDeltaRows], gc[kDeltaRows];  // kVec: this lane's 16-byte chunk of each row, all loads issued first
#pragma unroll
  for (int k = 0; k < kDeltaRows; ++k) {  // no early return: every lane takes part in the shuffles below
    const Index item = first + Index(k) * groups;
    items[k] = item;
    acc[k] = 0.f;
    oc[k] = gc[k] = make_uint4(0u, 0u, 0u, 0u);
    if (item >= total) continue;
    const int h = int(item % Index(p.q_heads));
    const Index rt = item / Index(p.q_heads);
    const int64_t r = int64_t(rt % Index(p.rows_q)), tb = int64_t(rt / Index(p.rows_q));
    const T* o = static_cast<const T*>(p.out) + p.out_stride.offset(tb, r, h);
    const T* g = static_cast<const T*>(p.dout) + p.dout_stride.offset(tb, r, h);
    if constexpr (kVec) {  // one chunk per lane: the launch gives a row at least head_dim / 8 lanes
      if (8 * sub < p.head_dim) {
        oc[k] = *reinterpret_cast<const uint4*>(o + 8 * sub);
        gc[k] = *reinterpret_cast<const uint4*>(g + 8 * sub);
      }
    } else {
      for (int c = sub; c < p.head_dim; c += lanes) acc[k] += cuda::to_float(o[c]) * cuda::to_float(g[c]);
    }
  }
  if constexpr (kVec) {
#pragma unroll
    for (int k = 0; k < kDeltaRows; ++k) acc[k] = dot8<T>(oc[k], gc[k]);
  }
#pragma unroll
  for (int k = 0; k < kDeltaRows; ++k) {
    for (int off = lanes / 2; off > 0; off /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
    if (items[k] < total && sub == 0) {
      const int h = int(items[k] % Index(p.q_heads));
      const Index rt = items[k] / Index(p.q_heads);
      const int64_t r = int64_t(rt % Index(p.rows_q)), tb = int64_t(rt / Index(p.rows_q));
      float d = acc[k];
      if (p.dlse) d -= p.dlse[p.dlse_stride.offset(tb, h, r)];  // the loss's dependence on lse
      p.delta[(tb * p.q_heads + h) * p.rows_q + r] = d;
    }
  }
}

// Zeroes rows [row0, row0 + rows) of every head of a (1, rows, heads, d) gradient (varlen rows no sequence covers).
template <class T>
__global__ void bwd_zero_rows_kernel(T* base, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t rows,
                                     int heads, int d) {
  const int64_t n = rows * heads * d;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % d);
    const int h = int(i / d % heads);
    const int64_t r = row0 + i / (int64_t(d) * heads);
    base[r * row_stride + h * head_stride + c] = cuda::from_float<T>(0.f);
  }
}

// ------------------------------------------------------------------ dK, dV

template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1) bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, LD = Cfg::LD, ND = Cfg::ND;
  constexpr int NTM = BM / 8;  // n8 tiles of S^T over the q rows
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const GridPlace place = grid_place(p.k_tiles, p.kv_heads, p.sink_block_first);
  const int kt = place.tile, kvh = place.head, b = place.batch;
  const SeqInfo s = seq_info(p, b);
  const int j0 = kt * BN;
  if (j0 >= s.sk) return;
  const int j1 = min(j0 + BN, s.sk);

  // Shared memory: K, V (BN x LD); stage st (0, 1): Q and dO (BM x LD) at lay.ring(st), and the row terms of its
  // q block at rows0 + st * 5 * BM: L log2e, D, then the key intervals (lo, hi, sink end) as ints.
  const PairLayout<Cfg::TILE_N_BYTES, Cfg::TILE_M_BYTES> lay(smem_raw);
  const uint32_t sK = lay.first, sV = lay.second();
  float* rows0 = lay.terms;

  const T* kg = static_cast<const T*>(p.k) + p.k_stride.offset(s.tb, s.k_row0, kvh);
  const T* vg = static_cast<const T*>(p.v) + p.v_stride.offset(s.tb, s.k_row0, kvh);
  cuda_fwd::load_tile<Cfg, BN>(sK, kg, p.k_stride.seq, j0, s.sk, p.vec_in);
  cuda_fwd::load_tile<Cfg, BN>(sV, vg, p.v_stride.seq, j0, s.sk, p.vec_in);

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int kw = warp * 16;  // this warp's first key within the block
  const uint32_t a_off = uint32_t(lane_a(lane, LD) * 2), b_off = uint32_t(lane_b(lane, LD) * 2);

  // Work items: (q head of the group, q block) pairs over the q blocks that see this key block (qr), in order
  // (q_item), as in the Hopper kernel.
  const BlockRange qr = q_blocks_seeing_keys(p.mask, j0, j1, s.sq, s.sk, BM);
  const int items = p.group * (qr.end - qr.begin);
  // Issues the copies of item x's Q and dO into stage `into` and writes its row terms there.
  const auto issue = [&](int x, int into) {
    const QItem it = q_item(x, qr, p.group, BM);
    const int h = kvh * p.group + it.hg, i0 = it.i0;
    const T* qg = static_cast<const T*>(p.q) + p.q_stride.offset(s.tb, s.q_row0, h);
    const T* og = static_cast<const T*>(p.dout) + p.dout_stride.offset(s.tb, s.q_row0, h);
    const uint32_t sQ = lay.ring(into);
    cuda_fwd::load_tile<Cfg, BM>(sQ, qg, p.q_stride.seq, i0, s.sq, p.vec_in);
    cuda_fwd::load_tile<Cfg, BM>(sQ + Cfg::TILE_M_BYTES, og, p.dout_stride.seq, i0, s.sq, p.vec_in);
    const float* lse = p.lse + s.tb * p.lse_stride.batch + int64_t(h) * p.lse_stride.head;
    const float* delta = p.delta + (s.tb * p.q_heads + h) * p.rows_q + s.q_row0;
    float* sL2 = rows0 + into * 5 * BM;
    float* sD = sL2 + BM;
    int* sLo = reinterpret_cast<int*>(sD + BM);
    for (int r = tid; r < BM; r += Cfg::THREADS) {
      const RowTerms rt = row_terms(p, s, lse, delta, i0 + r);
      sL2[r] = rt.l2, sD[r] = rt.d, sLo[r] = rt.lo, sLo[BM + r] = rt.hi, sLo[2 * BM + r] = rt.se;
    }
  };

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int dn = 0; dn < ND; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dn][e] = dv[dn][e] = 0.f;

  // Two-stage pipeline: item x is computed from `stage` while the next visible item's copies land in the other.
  int x = 0, stage = 0;
  if (x < items) issue(x, 0);
  cuda_fwd::cp_async_commit();  // K, V and the first item
  while (x < items) {
    cuda_fwd::cp_async_wait<0>();
    __syncthreads();  // item x is in `stage` for everyone; every warp is done with the other stage
    const int xn = x + 1;
    if (xn < items) issue(xn, stage ^ 1);
    cuda_fwd::cp_async_commit();

    const int i0 = q_item(x, qr, p.group, BM).i0, i1 = min(i0 + BM, s.sq);
    const uint32_t sQ = lay.ring(stage), sO = sQ + Cfg::TILE_M_BYTES;
    const float* terms = rows0 + stage * 5 * BM;
    const bool full = i1 - i0 == BM && j1 - j0 == BN &&
                      tile_fully_visible(p.mask, i0, i1, j0, j1, s.sq, s.sk);

    // S^T = K Q^T and dP^T = V dO^T (this warp's 16 keys x BM q rows).
    float st[NTM][4], dpt[NTM][4];
    warp_mma_pair<T, Cfg>(st, dpt, sK, sV, sQ, sO, kw, a_off, b_off);

    // P^T and dS^T, packed to 16 bits as A operands (rows: keys; columns: q rows of the block).
    uint32_t pk[NTM][2], dsk[NTM][2];
    probs_transposed_tile<T, BM, NTM>(pk, p, terms, j0 + kw + g, 2 * t, full, &st[0][0]);
    grads_transposed_tile<T, BM, NTM>(dsk, terms, 2 * t, full, &st[0][0], &dpt[0][0]);

    // dV += P^T dO, dK += dS^T Q (k steps over the q rows; dO and Q as B operands through ldmatrix.trans).
#pragma unroll
    for (int kb = 0; kb < BM / 16; ++kb) {
      const uint32_t pa[4] = {pk[2 * kb][0], pk[2 * kb][1], pk[2 * kb + 1][0], pk[2 * kb + 1][1]};
      const uint32_t da[4] = {dsk[2 * kb][0], dsk[2 * kb][1], dsk[2 * kb + 1][0], dsk[2 * kb + 1][1]};
#pragma unroll
      for (int dn = 0; dn < ND; dn += 2) {
        mma_pair_n16<T, true>(dv, dk, dn, pa, da, sO, sQ, a_off + uint32_t((kb * 16 * LD + dn * 8) * 2));
      }
    }
    x = xn;
    stage ^= 1;
  }

  // Epilogue: dK (times scale) and dV staged over the K and V tiles, written once.
  cuda_fwd::cp_async_wait<0>();
  __syncthreads();
  T* stK = reinterpret_cast<T*>(smem_raw);
  T* stV = reinterpret_cast<T*>(smem_raw + Cfg::TILE_N_BYTES);
  stage_acc<T, ND, LD>(stK, dk, p.scale, kw, g, t);
  stage_acc<T, ND, LD>(stV, dv, 1.f, kw, g, t);
  __syncthreads();
  T* dkg = static_cast<T*>(p.dk) + p.dk_stride.offset(s.tb, s.k_row0 + j0, kvh);
  T* dvg = static_cast<T*>(p.dv) + p.dv_stride.offset(s.tb, s.k_row0 + j0, kvh);
  store_tile<Cfg, BN>(stK, dkg, p.dk_stride.seq, 0, j1 - j0, p.vec_out);
  store_tile<Cfg, BN>(stV, dvg, p.dv_stride.seq, 0, j1 - j0, p.vec_out);
}

// ------------------------------------------------------------------ dQ and dsink

template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1) bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, LD = Cfg::LD, ND = Cfg::ND;
  constexpr int NTN = BN / 8;  // n8 tiles of S over the keys
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const int qt = int(blockIdx.x % unsigned(p.q_tiles));
  const int rest = int(blockIdx.x / unsigned(p.q_tiles));
  const int h = rest % p.q_heads, b = rest / p.q_heads;
  // This block's dsink slot: (batch, q_heads, q_tiles), i.e. blockIdx.x.
  float* slot = p.dsink_part ? p.dsink_part + blockIdx.x : nullptr;
  const SeqInfo s = seq_info(p, b);
  const int i0 = qt * BM;
  if (i0 >= s.sq) {
    if (slot && threadIdx.x == 0) *slot = 0.f;
    return;
  }
  const int i1 = min(i0 + BM, s.sq);
  const int kvh = h / p.group;

  // Shared memory: Q, dO (BM x LD); stage st (0, 1): K and V (BN x LD) at lay.ring(st); the dsink terms.
  const PairLayout<Cfg::TILE_M_BYTES, Cfg::TILE_N_BYTES> lay(smem_raw);
  const uint32_t sQ = lay.first, sO = lay.second();
  float* sPart = lay.terms;

  const T* qg = static_cast<const T*>(p.q) + p.q_stride.offset(s.tb, s.q_row0, h);
  const T* og = static_cast<const T*>(p.dout) + p.dout_stride.offset(s.tb, s.q_row0, h);
  const T* kg = static_cast<const T*>(p.k) + p.k_stride.offset(s.tb, s.k_row0, kvh);
  const T* vg = static_cast<const T*>(p.v) + p.v_stride.offset(s.tb, s.k_row0, kvh);
  const float* lse = p.lse + s.tb * p.lse_stride.batch + int64_t(h) * p.lse_stride.head;
  const float* delta = p.delta + (s.tb * p.q_heads + h) * p.rows_q + s.q_row0;
  const KeyTiles ktl = cuda_fwd::key_tiles(p.mask, i0, i1, s.sq, s.sk, BN);
  const auto issue_kv = [&](int n, int into) {
    const int j0 = ktl.tile(n) * BN;
    const uint32_t sK = lay.ring(into);
    cuda_fwd::load_tile<Cfg, BN>(sK, kg, p.k_stride.seq, j0, s.sk, p.vec_in);
    cuda_fwd::load_tile<Cfg, BN>(sK + Cfg::TILE_N_BYTES, vg, p.v_stride.seq, j0, s.sk, p.vec_in);
  };
  cuda_fwd::load_tile<Cfg, BM>(sQ, qg, p.q_stride.seq, i0, s.sq, p.vec_in);
  cuda_fwd::load_tile<Cfg, BM>(sO, og, p.dout_stride.seq, i0, s.sq, p.vec_in);
  if (ktl.count > 0) issue_kv(0, 0);
  cuda_fwd::cp_async_commit();  // Q, dO and the first key tile

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int qw = warp * 16;  // this warp's first row within the block
  const uint32_t a_off = uint32_t(lane_a(lane, LD) * 2), b_off = uint32_t(lane_b(lane, LD) * 2);

  // dsink's share of these rows: -exp(sink - L_i) D_i per row, summed by one thread in row order.
  if (slot) {
    const float sink = p.sink_logits[h];
    for (int r = tid; r < BM; r += Cfg::THREADS) {
      const int i = i0 + r;
      sPart[r] = i < s.sq && sink != -INFINITY ? -expf(sink - lse[(s.q_row0 + i) * p.lse_stride.seq]) * delta[i] : 0.f;
    }
  }

  // The two rows of this thread (g and g + 8 of the warp's 16): L log2e, D and the visible key intervals.
  RowTerms rt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) rt[r] = row_terms(p, s, lse, delta, i0 + qw + g + 8 * r);

  float dq[ND][4];
#pragma unroll
  for (int dn = 0; dn < ND; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[dn][e] = 0.f;

  // Two-stage pipeline: key tile n is computed from stage n % 2 while tile n + 1's copies land in the other.
  for (int n = 0; n < ktl.count; ++n) {
    cuda_fwd::cp_async_wait<0>();
    __syncthreads();  // tile n is in its stage for everyone; every warp is done with the other stage
    if (n + 1 < ktl.count) issue_kv(n + 1, (n + 1) % 2);
    cuda_fwd::cp_async_commit();
    const int j0 = ktl.tile(n) * BN, j1 = min(j0 + BN, s.sk);
    const uint32_t sK = lay.ring(n % 2), sV = sK + Cfg::TILE_N_BYTES;

    const bool full = i1 - i0 == BM && j1 - j0 == BN && tile_fully_visible(p.mask, i0, i1, j0, j1, s.sq, s.sk);

    // S = Q K^T and dP = dO V^T (this warp's 16 rows x BN keys).
    float sc[NTN][4], dp[NTN][4];
    warp_mma_pair<T, Cfg>(sc, dp, sQ, sO, sK, sV, qw, a_off, b_off);

    // dS packed to 16 bits as the A operand (rows: this warp's q rows; columns: keys).
    uint32_t dsk[NTN][2];
    probs_tile<NTN>(p, rt, j0 + 2 * t, full, &sc[0][0]);
    grads_tile<T, NTN>(dsk, rt, full, &sc[0][0], &dp[0][0]);

    // dQ += dS K (k steps over the keys; K as the B operand through ldmatrix.trans).
#pragma unroll
    for (int kb = 0; kb < BN / 16; ++kb) {
      const uint32_t da[4] = {dsk[2 * kb][0], dsk[2 * kb][1], dsk[2 * kb + 1][0], dsk[2 * kb + 1][1]};
#pragma unroll
      for (int dn = 0; dn < ND; dn += 2) {
        uint32_t kbv[4];
        cuda_fwd::ldmatrix_x4_trans(kbv, sK + a_off + uint32_t((kb * 16 * LD + dn * 8) * 2));
        cuda_fwd::mma_16816<T>(dq[dn], da, kbv[0], kbv[1]);
        cuda_fwd::mma_16816<T>(dq[dn + 1], da, kbv[2], kbv[3]);
      }
    }
  }

  // Epilogue: dQ (times scale) staged over the Q tile and written once; the dsink share summed in row order.
  cuda_fwd::cp_async_wait<0>();
  __syncthreads();
  if (slot && tid == 0) {
    float sum = 0.f;
    for (int r = 0; r < BM; ++r) sum += sPart[r];
    *slot = sum;
  }
  T* stQ = reinterpret_cast<T*>(smem_raw);
  stage_acc<T, ND, LD>(stQ, dq, p.scale, qw, g, t);
  __syncthreads();
  T* dqg = static_cast<T*>(p.dq) + p.dq_stride.offset(s.tb, s.q_row0, h);
  store_tile<Cfg, BM>(stQ, dqg + int64_t(i0) * p.dq_stride.seq, p.dq_stride.seq, 0, i1 - i0, p.vec_out);
}

}  // namespace flashlite::cuda_bwd
