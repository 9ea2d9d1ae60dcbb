#pragma once
// Kernel parameters of the CUDA backward (src/cuda/bwd/), filled once per call by launch.cu and passed by value
// (__grid_constant__). Varlen offsets live in the workspace (copied there by launch.cu), never in host memory.
#include <cstdint>

#include "common/mask.h"
#include "common/strides.h"

namespace flashlite::cuda_bwd {

// Tile sizes shared by the kernels and the host (workspace slots of the dQ kernel's dsink partials).
inline constexpr int kBlockM = 64;  // query rows per tile
inline constexpr int kBlockN = 64;  // keys per tile
inline constexpr int kWarps = 4;    // each warp owns 16 keys (dK/dV kernel) or 16 query rows (dQ kernel)

struct BwdParams {
  const void* q = nullptr;     // (batch, seq_q, q_heads, head_dim), head_dim contiguous
  const void* k = nullptr;     // (batch, seq_k, kv_heads, head_dim)
  const void* v = nullptr;     // (batch, seq_k, kv_heads, head_dim)
  const void* out = nullptr;   // (batch, seq_q, q_heads, head_dim)
  const void* dout = nullptr;  // (batch, seq_q, q_heads, head_dim)
  const float* lse = nullptr;  // (batch, q_heads, seq_q), natural log, as forward wrote it
  const float* sink_logits = nullptr;  // optional (q_heads)
  const float* dlse = nullptr;  // optional (batch, q_heads, seq_q): the loss's gradient with respect to lse
  void* dq = nullptr;          // like q
  void* dk = nullptr;          // like k
  void* dv = nullptr;          // like v
  float* dsink = nullptr;      // optional (q_heads)

  RowStrides q_stride, k_stride, v_stride, out_stride, dout_stride, dq_stride, dk_stride, dv_stride;
  LseStrides lse_stride, dlse_stride;

  int batch = 0;     // sequences
  int seq_q = 0;     // padded: every sequence; varlen: the longest
  int seq_k = 0;
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int group = 1;     // q_heads / kv_heads
  int q_tiles = 0;   // cdiv(seq_q, kBlockM): query tiles of the longest sequence
  int k_tiles = 0;   // cdiv(seq_k, kBlockN)
  int tensor_batch = 1;  // batch of the tensors (1 for varlen)
  int64_t rows_q = 0;    // q.shape[1]: seq_q, or total rows (varlen)
  int64_t rows_k = 0;    // k.shape[1]

  float scale = 1.f;       // softmax scale
  float scale_log2 = 0.f;  // scale * log2(e)
  float softcap = 0.f;     // 0: none
  float softcap_pre = 0.f;   // scale / softcap
  float softcap_post = 0.f;  // softcap * log2(e)
  bool vec_in = false;     // q, k, v, dout rows are 16-byte aligned (cp.async 16-byte copies)
  bool vec_out = false;    // dq, dk, dv rows are 16-byte aligned (16-byte stores)
  bool sink_block_first = false;  // the dK / dV grids run every head's key block 0 first (cuda_bwd::grid_place)
  MaskParams mask;

  const int* cu_q = nullptr;  // varlen: (batch + 1) on the device; null when padded
  const int* cu_k = nullptr;

  // Workspace.
  float* delta = nullptr;       // (tensor_batch, q_heads, rows_q): D = dout . out (less dlse when given) per row
  float* dsink_part = nullptr;  // (batch, q_heads, q_tiles): each dQ block's share of dsink
};

}  // namespace flashlite::cuda_bwd
