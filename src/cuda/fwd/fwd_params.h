#pragma once
// Kernel parameters of the fused forward kernels (tensor-core and fp32), filled once per call by launch.cu.
// Passed by value as a __grid_constant__ kernel argument: no device allocation, no host sync, so a padded call
// (and a varlen call with at most kInlineSeqs sequences) can be captured in a CUDA graph.
#include <cstdint>

#include "common/mask.h"
#include "common/strides.h"

namespace flashlite::cuda_fwd {

// Varlen offsets of up to this many sequences travel inside the kernel parameters (2 x 129 int32 = 1 KiB).
inline constexpr int kInlineSeqs = 128;

// Long rows (docs/numerics.md): a tensor-core MMA truncates what it adds into its fp32 accumulator, a bias that grows
// with the number of MMAs summed into O (2.4e-2 relative over 2^22 keys on the H100). A block whose rows see more than
// kFoldKeys keys therefore folds its O accumulators and row sums, every kFoldKeys keys, into fp32 in global memory
// with ordinary round-to-nearest adds (FwdParams::fold), so no accumulator ever sums more than kFoldKeys keys.
inline constexpr int kFoldKeys = 1 << 15;

// Floats of fold space per block of block_rows query rows (each thread's O share, its rows' max and sum).
constexpr int64_t fold_floats_per_block(int block_rows, int head_dim) { return int64_t(block_rows) * (head_dim + 8); }

enum class VarlenMode : int { padded = 0, inline_table = 1, device_table = 2 };

// Work tiles of unequal work (causal, windows, varlen): the persistent Hopper kernel hands them out through a tile
// counter (its dynamic schedule, launch_hopper.cu) when it has more tiles than CTAs, and the forward's workspace holds
// that counter for every such call (cuda_fused_workspace_bytes, launch.cu).
// Rows whose visible keys differ from row to row (causal or windowed): the planners' tile choices depend on it.
constexpr bool masked_rows(const MaskParams& m) { return m.causal || m.window_left >= 0 || m.window_right >= 0; }
constexpr bool uneven_tiles(const MaskParams& m, bool varlen) { return masked_rows(m) || varlen; }

struct FwdParams {
  const void* q = nullptr;  // (batch, seq_q, q_heads, head_dim), head_dim contiguous
  const void* k = nullptr;  // (batch, seq_k, kv_heads, head_dim)
  const void* v = nullptr;  // (batch, seq_k, kv_heads, head_dim)
  void* out = nullptr;      // (batch, seq_q, q_heads, head_dim)
  float* lse = nullptr;     // optional (batch, q_heads, seq_q), natural log
  const float* sink_logits = nullptr;  // optional (q_heads), natural-log units

  RowStrides q_stride, k_stride, v_stride, out_stride;  // elements
  LseStrides lse_stride;

  int batch = 0;    // sequences
  int seq_q = 0;    // padded: every sequence; varlen: the longest
  int seq_k = 0;
  int q_heads = 0;
  int group = 1;    // q_heads / kv_heads: kv_head = q_head / group
  int q_tiles = 0;  // tiles of the longest query sequence, cdiv(seq_q, block rows)

  float scale_log2 = 0;    // scale * log2(e): scores live in log2 units so exp2 is one instruction
  float softcap_pre = 0;   // scale / softcap
  float softcap_post = 0;  // softcap * log2(e)
  bool softcap = false;
  bool reverse_tiles = false;  // causal: the heaviest (last) query tile of each sequence starts first
  bool rank_major = false;     // block order: tile rank slowest (causal) instead of fastest
  int rank_group = 0;          // rank-major within groups of this many (sequence, head) pairs; 0 = one group
  bool vec_in = false;         // q, k, v rows are 16-byte aligned: cp.async 16-byte copies
  bool vec_out = false;        // out rows are 16-byte aligned: 16-byte stores
  MaskParams mask;
  // Long rows: fold space of fold_floats_per_block per block (block b at fold + b * that), when some row may see
  // more than kFoldKeys keys; null otherwise (the tensor-core kernels then never fold).
  float* fold = nullptr;
  // The Hopper kernel's dynamic schedule: 4 bytes of the workspace (the caller's or the call's) for its tile counter,
  // which the launch zeroes on the stream when it schedules dynamically (launch_hopper.cu); null for tiles of equal
  // work. The kernels never read it (the Hopper kernel takes HopperParams::tile_counter).
  unsigned* tile_counter_space = nullptr;

  VarlenMode varlen = VarlenMode::padded;
  const int* cu_dev = nullptr;         // device_table: (2, batch + 1): cu_seqlens_q then cu_seqlens_k
  int cu_inline[2][kInlineSeqs + 1]{};  // inline_table: cu_seqlens_q, cu_seqlens_k

  // Prefill from a KV cache (read only by the kernels instantiated with CACHE = true). q / out / lse are padded or
  // ragged (varlen tables: only cu_seqlens_q is used); K/V of sequence b come from the cache, its length from the
  // cache's device index. Contiguous: key j at k + k_stride.offset(b, j, h). Paged: at k + k_stride.offset(page,
  // j % page_size, h) with page = indices[indptr[b] + j / page_size] (k_stride.batch: the page stride). The names
  // of DecodeParams and AppendParams: one fill for all (cuda::set_cache_index).
  bool paged = false;
  int page_size = 0;
  const int* seq_lens = nullptr;       // contiguous: (batch)
  const int* indptr = nullptr;         // paged: (batch + 1)
  const int* indices = nullptr;        // paged
  const int* last_page_len = nullptr;  // paged: (batch)
};

}  // namespace flashlite::cuda_fwd
