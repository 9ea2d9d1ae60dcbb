#pragma once
// y = x W^T for a few activation rows (decode steps), bf16 weights streamed once with 16-byte loads, fp32
// accumulation, with the neighbouring small ops fused in so a layer is 4 launches plus attention:
//   rmsnorm prologue   x = rmsnorm(fp32 residual stream) * norm weight, staged in shared memory as bf16 (as the
//                      separate RMSNorm kernel rounds it), for the QKV, gate/up and LM-head GEMVs;
//   epilogues          bf16 store (QKV), fp32 store (logits), fp32 accumulate into the residual stream (O, down),
//                      SwiGLU (gate row i and up row i + out computed by the same warp; h = silu(g) * u in bf16).
// A warp owns one weight row (SwiGLU: a gate row and its up row) over the whole reduction, 4 KB of loads in flight;
// blocks loop over row groups (grid sized to the machine). Launched as programmatic dependents (pdl.cuh).
// cuBLASLt keeps prefill (many rows) and the fp32 path.
#include <cstddef>
#include <cstdint>

namespace flashlite::engine::cuda_ops {

constexpr int kGemvMaxRows = 8;

enum class GemvIn { bf16, rmsnorm };
enum class GemvOut { bf16, f32, add_f32, swiglu_bf16 };

struct GemvParams {
  const void* w = nullptr;  // (out, k) bf16 row-major; swiglu: (2 out, k), the gate rows then the up rows
  int out = 0;              // output columns per row (swiglu: hidden)
  int k = 0;                // reduction length, a multiple of 8
  int rows = 0;             // activation rows, 1..kGemvMaxRows
  GemvIn in = GemvIn::bf16;
  const void* x = nullptr;             // bf16: (rows, k) bf16
  const float* xf = nullptr;           // rmsnorm: fp32 residual stream (any rows, k)
  const void* norm_w = nullptr;        // rmsnorm: (k) bf16
  const int32_t* row_index = nullptr;  // rmsnorm: stream row of each activation row; nullptr = row r
  float eps = 0;
  GemvOut epi = GemvOut::bf16;
  void* y = nullptr;  // (rows, out): bf16 | fp32 | fp32 added to | bf16
  int prefetch_lines = 0;  // 128-byte lines of each of its first rows a warp prefetches to L2 before griddepcontrol.wait
};

// Whether gemv takes these sizes (k a multiple of 8, rows in range, the staged rows fit in shared memory).
bool gemv_supported(int rows, int k);
void gemv(const GemvParams& p, void* stream);

}  // namespace flashlite::engine::cuda_ops
