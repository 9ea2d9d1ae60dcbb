#pragma once
// CPU kernels of the model (fp32). Matmuls are y = x W^T with W row-major [out, in] (the checkpoint layout), so every
// output is a dot product of two contiguous rows; the AVX2 path blocks 4 weight rows x 2 activation rows in registers.
#include <cstdint>

namespace flashlite::engine::cpu {

struct MatmulArgs {
  float* y;        // (rows, out), row stride ldy
  const float* x;  // (rows, in), row stride ldx
  const float* w;  // (out, in), contiguous
  int rows = 0, in = 0, out = 0;
  int64_t ldx = 0, ldy = 0;
  int threads = 1;  // parallelise over output rows when > 1 and the product is large enough
};

void matmul(const MatmulArgs& a);
// The code path matmul() takes on this CPU: "avx2" or "portable".
const char* matmul_variant();

// One block of rows [o0, o1) of the output for every activation row; the per-ISA entry points.
void matmul_block_portable(const MatmulArgs& a, int o0, int o1);
void matmul_block_avx2(const MatmulArgs& a, int o0, int o1);

// y = x * rsqrt(mean(x^2) + eps) * weight, one row of n.
void rmsnorm(float* y, const float* x, const float* weight, int n, float eps);
// h[i] = silu(gate[i]) * up[i].
void swiglu(float* h, const float* gate, const float* up, int n);

}  // namespace flashlite::engine::cpu
