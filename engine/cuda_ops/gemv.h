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
//
// Opt-in variants (engine switches, off by default; docs/perf-notes.md "Round 3"):
//   split > 1        split-K inside a block: `split` warps share an output row, each reducing a contiguous slice of k;
//                    their partial sums meet in shared memory and are added in a fixed order (deterministic, no
//                    atomics, no second pass), so short-and-wide matrices (down: 2048 x 8192) get split x the warps;
//   rope_bf16        the QKV epilogue rotates q and k (RoPE) and appends k and v to the KV cache, the separate
//                    rope_append launch gone: a block owns 8 rows of one head that form 4 rotation pairs; the values are
//                    rounded to bf16 before the rotation exactly as the unfused path stores and reloads them;
//   f32_argmax       the LM-head epilogue also folds each row's argmax key (select.h's) into argmax_keys with one
//                    64-bit atomicMax per block and row (order-independent: deterministic); keys zeroed beforehand;
//   preload          each warp loads its first batch of weights into registers before griddepcontrol.wait (weights
//                    are never written by a predecessor), instead of or besides the L2 prefetch;
//   late_trigger     griddepcontrol.launch_dependents after the main loop instead of first thing;
//   stream           (one row, sm_90, k a multiple of 256; bf16, add_f32, swiglu_bf16 and rope_bf16 epilogues)
//                    gemv_stream.cu: the weights stream through a ring of shared-memory slots filled by bulk copies,
//                    the first ring's worth before griddepcontrol.wait, so a GEMV's stream starts while its
//                    predecessor still runs; needs `counters` (2 words per call site, zeroed once, left zeroed).
#include <cstddef>
#include <cstdint>

namespace flashlite::engine::cuda_ops {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvBlockPerTile = 1 << 30;  // GemvParams::grid_blocks: one block per tile
constexpr int kGemvTimelineStamps = 5;  // diagnostic builds: timeline words per block (GemvParams::timeline)

enum class GemvIn { bf16, rmsnorm };
enum class GemvOut { bf16, f32, add_f32, swiglu_bf16, rope_bf16, f32_argmax };

// rope_bf16: where the QKV row's parts go. y receives the rotated q heads only (the k and v columns of y are not
// written); k (rotated) and v go to row cache_row[r] of the caches. Requires head_dim % 8 == 0 and
// out == (heads + 2 kv_heads) * head_dim.
struct GemvRope {
  const float* cos = nullptr;          // (positions, head_dim / 2)
  const float* sin = nullptr;
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
  void* y = nullptr;  // (rows, out): bf16 | fp32 | fp32 added to | bf16
  int prefetch_lines = 0;  // 128-byte lines of each of its first rows a warp prefetches to L2 before griddepcontrol.wait
  int split = 1;           // warps per output row (1, 2, 4, 8; bf16 / f32 / add_f32 / f32_argmax epilogues only)
  bool preload = false;    // first batch of weights into registers before griddepcontrol.wait
  bool preload_after_x = false;  // with preload and the RMSNorm prologue: that batch after the wait, behind the x loads
  bool weight_evict_first = false;  // the weight loads marked evict-first in L2 (read once per step)
  bool norm_early = false;  // RMSNorm prologue (<= 2 rows, k <= 2048): the norm weight loaded before the wait
  // Blocks launched: 0 (default) one resident wave (each block loops over its tiles); > 0 that many,
  // at most one per tile (kGemvBlockPerTile: a block per tile, so the hardware hands tiles to the SMs as blocks finish;
  // the engine's one-row gate/up and LM-head GEMVs, docs/perf-notes.md "Round 12" and "Round 13").
  int grid_blocks = 0;
  bool late_trigger = false;
  bool stream = false;                // the streamed kernel where gemv_stream_supported (else the others)
  int stream_stages = 16;             // its 8 KB ring slots, a multiple of 8 (slot s: consumer warp s % 8)
  int stream_blocks_per_sm = 1;
  uint32_t* counters = nullptr;       // stream: (2) work counters of this call site, zero before the first launch
  GemvRope rope;                      // rope_bf16
  uint64_t* argmax_keys = nullptr;    // f32_argmax: (rows), zeroed before the launch
  // Diagnostic builds only (-DFLASHLITE_DECODE_TIMELINE=1; FLASHLITE_ENGINE_TIMELINE): the register kernels' thread 0
  // of each block writes %globaltimer at its start, after the wait and prologue, at its end, right after the wait and
  // once its prologue loads have arrived: (blocks, kGemvTimelineStamps) words.
  unsigned long long* timeline = nullptr;
};

// The split the engine's FLASHLITE_ENGINE_SPLITK=1 picks: the largest power of two <= 8 that keeps every warp at
// two or more batches of loads (k / 8 / split >= 512 chunks) and the warps within one resident wave (4 blocks of 8
// warps per SM); 1 for the O and QKV shapes of Llama-3.2-1B, 2 for down.
int gemv_auto_split(int out, int k);

// Whether gemv takes these sizes: k a multiple of 8, rows in range, and for a staged input (the RMSNorm prologue,
// GemvIn::rmsnorm: rows x k bf16 in shared memory) the staged rows within this device's shared memory (160 KB, less
// on GPUs with a smaller opt-in limit, where the engine then takes cuBLASLt). A bf16 input stages nothing.
bool gemv_supported(int rows, int k, bool staged);
void gemv(const GemvParams& p, void* stream);

// Whether p (with p.stream) takes the streamed kernel on this device; gemv falls back to the others where not.
bool gemv_stream_supported(const GemvParams& p);
void gemv_stream(const GemvParams& p, void* stream);

}  // namespace flashlite::engine::cuda_ops
