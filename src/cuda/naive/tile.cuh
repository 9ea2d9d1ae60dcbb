#pragma once
// The shared-memory tile both batched GEMMs use: a 64 x 64 output tile per block of 256 threads, 16-deep slices of
// the reduction dimension staged in shared memory as fp32 (A transposed so a thread's 4 rows are adjacent), and a
// 4 x 4 register micro-tile per thread. Plain FMA on CUDA cores: this is the textbook baseline, not a fast GEMM.
#include <cstdint>

namespace flashlite::cuda_naive {

inline constexpr int kTileM = 64;   // output rows per block
inline constexpr int kTileN = 64;   // output columns per block
inline constexpr int kTileK = 16;   // reduction depth per shared-memory stage
inline constexpr int kThreads = 256;
inline constexpr int kPad = 4;      // keeps the float4 reads aligned and spreads the transposed stores over banks

struct SharedTiles {
  float a[kTileK][kTileM + kPad];  // (k, m): A^T slice
  float b[kTileK][kTileN + kPad];  // (k, n): B slice
};

// Thread t owns output rows 4 * (t / 16) .. +3 and columns 4 * (t % 16) .. +3 of the tile.
__device__ __forceinline__ int micro_row() { return 4 * int(threadIdx.x / 16); }
__device__ __forceinline__ int micro_col() { return 4 * int(threadIdx.x % 16); }

// acc += A_slice^T-staged x B_slice over one kTileK stage.
__device__ __forceinline__ void tile_fma(const SharedTiles& t, float (&acc)[4][4]) {
  const int r0 = micro_row(), c0 = micro_col();
#pragma unroll
  for (int kk = 0; kk < kTileK; ++kk) {
    const float4 a = *reinterpret_cast<const float4*>(&t.a[kk][r0]);
    const float4 b = *reinterpret_cast<const float4*>(&t.b[kk][c0]);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
  }
}

// Calls store(i, j, rr, cc) for each output (i, j) = (i0 + micro_row() + rr, j0 + micro_col() + cc) of this thread's
// micro-tile with i < rows and j < cols.
template <class Store>
__device__ __forceinline__ void store_micro_tile(int64_t i0, int64_t j0, int64_t rows, int64_t cols, Store store) {
  const int r0 = micro_row(), c0 = micro_col();
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int64_t i = i0 + r0 + rr;
    if (i >= rows) break;
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int64_t j = j0 + c0 + cc;
      if (j < cols) store(i, j, rr, cc);
    }
  }
}

// Grid-stride helpers: grid.y and grid.z are capped at 65535, so blocks loop over the rest.
inline unsigned grid_cap(int64_t n) { return unsigned(n < 65535 ? (n < 1 ? 1 : n) : 65535); }

}  // namespace flashlite::cuda_naive
