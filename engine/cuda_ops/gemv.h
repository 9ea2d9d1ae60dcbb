#pragma once
// y = x W^T for a few activation rows (decode steps), bf16 weights streamed once with 16-byte loads, fp32
// accumulation, with the neighbouring small ops fused in so a layer is 4 launches plus attention:
//   rmsnorm prologue   x = rmsnorm(fp32 residual stream) * norm weight, staged in shared memory as bf16 (as the
//                      separate RMSNorm kernel rounds it), for the QKV, gate/up and LM-head GEMVs;
//   epilogues          bf16 store (QKV where RoPE cannot be fused), fp32 store (logits), fp32 accumulate into the
//                      residual stream (O, down), SwiGLU (gate row i and up row i + out computed by the same warp;
//                      h = silu(g) * u in bf16), and:
//   rope_bf16          the QKV epilogue rotates q and k (RoPE: flashlite/cuda/rope.cuh, the library's) and appends
//                      k and v to the flashlite KV cache, no separate append_kv launch: a block owns 8 rows of one
//                      head that form 4 rotation pairs; the values are rounded to bf16 before the rotation exactly as
//                      the unfused path stores them and append_kv reloads them;
//   sum_f32            add_f32 under tensor parallelism: each value is this rank's partial of a row-parallel projection (O,
//                      down): the warp that finished it sends it to the peers, waits for theirs and adds the sum
//                      over ranks (engine/parallel/peer_sum.h): the all-reduce without a kernel of its own;
//   f32_argmax         the LM-head epilogue also folds each row's argmax key (select.h's) into argmax_keys with one
//                      64-bit atomicMax per block and row (order-independent: deterministic); keys zeroed beforehand.
// A warp owns one weight row (SwiGLU: a gate row and its up row) over the whole reduction, 4 KB of loads in flight, or
// with split > 1 a slice of it: `split` warps share an output row, their partial sums meet in shared memory and are
// added in a fixed order (deterministic, no atomics), so short-and-wide matrices (down: 2048 x 8192) get more warps.
// Blocks loop over block-uniform tiles. Launched as programmatic dependents (pdl.cuh): each warp loads its first batch
// of weights into registers and the RMSNorm prologue its norm weight before griddepcontrol.wait (no predecessor
// writes a weight); the weight loads are marked evict-first in L2 (read once per step, they leave the KV cache,
// activations and norm weights there). cuBLASLt keeps prefill (many rows) and the fp32 path.
#include <cstddef>
#include <cstdint>

#include "engine/parallel/peer_sum.h"

namespace flashlite::engine::cuda_ops {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvBlockPerTile = 1 << 30;  // GemvParams::grid_blocks: one block per tile

enum class GemvIn { bf16, rmsnorm };
enum class GemvOut { bf16, f32, add_f32, sum_f32, swiglu_bf16, rope_bf16, f32_argmax };

// rope_bf16: where the QKV row's parts go. y receives the rotated q heads only (the k and v columns of y are not
// written); k (rotated) and v go to row cache_row[r] of the caches, seen as rows of kv_heads * head_dim: a
// flashlite KV cache, contiguous [slots, capacity, ...] (row slot * capacity + position) or paged [pages, page_size,
// ...] (row page * page_size + position % page_size), the row append_kv writes (KvBook::row). Requires
// head_dim % 8 == 0 and out == (heads + 2 kv_heads) * head_dim.
struct GemvRope {
  const float* cos = nullptr;          // (positions, head_dim / 2): flashlite::cuda::rope_cos_sin of each (position,
  const float* sin = nullptr;          //   pair), as ops.h's rope_tables fills them
  const int32_t* pos = nullptr;        // (rows) position of each activation row
  const int64_t* cache_row = nullptr;  // (rows) KV-cache row receiving this row's k and v
  void* k_cache = nullptr;             // (cache rows, kv_heads, head_dim) bf16
  void* v_cache = nullptr;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool interleaved = false;            // llama2.c pairs (2i, 2i + 1); else (i, i + head_dim / 2)
};

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
  void* y = nullptr;  // (rows, out): bf16 | fp32 | fp32 added to (add_f32, sum_f32) | bf16
  int split = 1;      // warps per output row (1, 2, 4, 8; bf16 / f32 / add_f32 / sum_f32 / f32_argmax only)
  // Blocks launched: 0 (default) one resident wave (each block loops over its tiles); > 0 that many, at most one per
  // tile (kGemvBlockPerTile: a block per tile, so the hardware hands tiles to the SMs as blocks finish).
  int grid_blocks = 0;
  bool pdl = true;                  // launched as a programmatic dependent where the device and the kernel have it
  GemvRope rope;                    // rope_bf16
  uint64_t* argmax_keys = nullptr;  // f32_argmax: (rows), zeroed before the launch
  PeerSum sum;  // sum_f32: the ranks' inboxes and rounds (peer_sum.h)
};

// The split-K the engine uses: the largest power of two <= 8 that keeps every warp at two or more batches of loads
// (k / 8 / split >= 512 chunks) and the warps within one resident wave (4 blocks of 8 warps per SM); 1 for the O and
// QKV shapes of Llama-3.2-1B, 2 for down.
int gemv_auto_split(int out, int k);

// Whether gemv takes these sizes: k a multiple of 8, rows in range, and for a staged input (the RMSNorm prologue,
// GemvIn::rmsnorm: rows x k bf16 in shared memory) the staged rows within this device's shared memory (160 KB, less
// on GPUs with a smaller opt-in limit, where the engine then takes cuBLASLt). A bf16 input stages nothing.
bool gemv_supported(int rows, int k, bool staged);
void gemv(const GemvParams& p, void* stream);

}  // namespace flashlite::engine::cuda_ops
