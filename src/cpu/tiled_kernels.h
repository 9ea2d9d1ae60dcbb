#pragma once
// The hot loops of the tiled CPU kernel, built once per instruction set (tiled_portable.cpp, tiled_avx2.cpp,
// tiled_avx512.cpp, all from the one template in tiled_simd.h). The algorithm around them (tiles, masks, the online
// softmax bookkeeping, output) is written once, in tiled.cpp, and calls them through this table.
//
// Only plain data and declarations here: an inline function in a header shared by translation units compiled for
// different instruction sets could be emitted with AVX instructions and then picked by the linker for every caller.
#include <cstdint>

#include "flashlite/tensor.h"

namespace flashlite {
enum class CpuSimd : uint8_t;  // src/backends.h
}

namespace flashlite::cpu_tiled {

// C (+)= A B over fp32 tiles. A(r, k) = a[r * a_row + k * a_k] (any strides: K rows in place, or P transposed);
// B(k, n) = b[k * ldb + n]; C(r, n) = c[r * ldc + n]. n is a multiple of the vector width; m and k are any size.
// accumulate: C = C * c_row_scale[r] + A B (c_row_scale null: C + A B); otherwise C = A B.
struct GemmArgs {
  const float* a;
  int64_t a_row, a_k;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  int64_t m, n, k;
  bool accumulate;
  const float* c_row_scale;
};

// rows x cols stored elements (f32/f16/bf16; row stride src_row, elements contiguous) -> fp32 dst (row stride ldd).
// Columns [cols, pad_cols) of dst are set to zero.
struct ConvertArgs {
  const void* src;
  DType dtype;
  int64_t src_row;
  float* dst;
  int64_t ldd;
  int64_t rows, cols, pad_cols;
};

// One online-softmax step over a tile of scores S^T (keys x query columns, masked entries -inf). log2_scale (> 0)
// turns a score into log2 units; m is kept in log2 units. Per query column n:
//   m_new = max(m[n], max_c s[c][n] * log2_scale)
//   s[c][n] = 2^(s[c][n] * log2_scale - m_new)   (one FMA: accurate for the large terms even when |s| is large)
//   alpha[n] = 2^(m[n] - m_new)                   (what the output accumulator must be scaled by)
//   l[n] = l[n] * alpha[n] + sum_c s[c][n];  m[n] = m_new
// Columns whose m stays -inf get p = 0 and alpha = 0. A NaN score gets p = NaN, so l turns NaN and stays NaN (m may
// then be anything); a +inf score makes m +inf and its p NaN. n is a multiple of the vector width.
struct SoftmaxArgs {
  float* s;
  int64_t lds;
  int64_t keys, n;
  float log2_scale;
  float* m;
  float* l;
  float* alpha;
};

// s[c][n] = out_mul * tanh(in_mul * s[c][n]) for c < keys, n < n (a multiple of the vector width).
struct SoftcapArgs {
  float* s;
  int64_t lds;
  int64_t keys, n;
  float in_mul, out_mul;
};

// Decode-shaped tasks (a few query columns: q_len 1..4 times the GQA group): keys, not query columns, are the vector
// lanes, so nothing is padded to the vector width but the key count of a chunk. Per chunk of `keys` keys:
//   small_scores:      s[n][c] = q[n] . k[c]  (c < keys; s[n][c] = 0 for c in [keys, round_up(keys, width)))
//   (the caller softcaps and masks, and sets s[n][c] = -inf for the padding keys)
//   small_softmax_pv:  the online-softmax step of SoftmaxArgs on row n of s, then o[n] = o[n] * alpha + sum_c p[c] v[c]
// q, k, v, o rows hold dp floats (a multiple of the width; k/v padding columns zero or the real row continuing).
struct SmallArgs {
  const float* q;  // (n, ldq)
  int64_t ldq;
  const float* k;  // (keys, k_row)
  int64_t k_row;
  const float* v;  // (keys, v_row)
  int64_t v_row;
  float* s;  // (n, lds) scores, then probabilities
  int64_t lds;
  float* o;  // (n, ldo) unnormalised output
  int64_t ldo;
  int64_t n, keys, dp;
  float log2_scale;
  float* m;  // (n) running max, log2 units
  float* l;  // (n) running sum
};

// The backward's element-wise step (src/backward/cpu.cpp) on one row of a tile, n a multiple of the width. With
// x = s[j] * scale and t = cap > 0 ? cap * tanh(x / cap) : x:
//   p = e^(t - L);  s[j] = p;  ds[j] = p * (ds[j] - D) * (cap > 0 ? 1 - (t / cap)^2 : 1) * scale
// (ds holds dP = dO V^T on entry). L = +inf gives p = 0; t - L past 128 (an lse that is not the forward's) gives +inf,
// NaN stays NaN. The caller zeroes the masked entries afterwards.
struct BwdRowArgs {
  float* s;
  float* ds;
  int64_t n;
  float scale, cap, lse, delta;
};

struct TiledKernels {
  const char* name;
  int width;  // floats per vector: query columns and padded head_dim are multiples of it
  void (*gemm)(const GemmArgs&);
  void (*convert)(const ConvertArgs&);
  void (*online_softmax)(const SoftmaxArgs&);
  void (*softcap)(const SoftcapArgs&);
  // Null where the instruction set has no transposing sum (V::hsum_rows): those builds keep the tiled path.
  void (*small_scores)(const SmallArgs&);
  void (*small_softmax_pv)(const SmallArgs&);
  void (*bwd_row)(const BwdRowArgs&);
};

const TiledKernels& kernels_portable();
const TiledKernels& kernels_avx2();
const TiledKernels& kernels_avx512();
const TiledKernels& kernels_of(CpuSimd simd);  // one of the three (tiled.cpp)

}  // namespace flashlite::cpu_tiled
