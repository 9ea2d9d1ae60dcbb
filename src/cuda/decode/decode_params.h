#pragma once
// Kernel parameters of the split-KV decode kernels (passed by value as a __grid_constant__ argument: no device
// allocation and no host sync, so a decode step can be captured in a CUDA graph). Filled by launch.cu.
#include <cstdint>

#include "common/mask.h"
#include "common/strides.h"
#include "cuda/decode/decode_timeline.h"  // kTimelineStamps

namespace flashlite::cuda_decode {

struct DecodeParams {
  const void* q = nullptr;  // (batch, q_len, q_heads, head_dim)
  void* out = nullptr;      // (batch, q_len, q_heads, head_dim)
  float* lse = nullptr;     // optional (batch, q_heads, q_len), natural log
  const float* sink_logits = nullptr;  // optional (q_heads)
  RowStrides q_stride, out_stride;
  LseStrides lse_stride;

  // Cache: token p of sequence b, head h at  stride.offset(page, slot, h)  with (page, slot) = (b, p) when
  // contiguous and (indices[indptr[b] + p / page_size], p % page_size) when paged.
  const void* k = nullptr;
  const void* v = nullptr;
  RowStrides k_stride, v_stride;
  bool paged = false;
  int page_size = 0;
  int page_shift = -1;  // log2(page_size) when a power of two (shift and mask instead of divide), else -1
  const int32_t* seq_lens = nullptr;       // contiguous: (batch), on the device
  const int32_t* indptr = nullptr;         // paged: (batch + 1)
  const int32_t* indices = nullptr;        // paged
  const int32_t* last_page_len = nullptr;  // paged: (batch)

  int batch = 0, q_len = 0, q_heads = 0, kv_heads = 0;
  int group = 1;       // q_heads / kv_heads
  int rows = 0;        // group * q_len: rows of one (sequence, kv head); row r = (q position r / group, head r % group)
  int row_chunks = 1;  // blocks over the rows (kDecodeRowsPerBlock rows each)
  int num_splits = 1;  // KV splits per (sequence, kv head, row chunk)

  float scale_log2 = 0;  // scale * log2(e)
  float scale = 0;
  float softcap = 0;     // 0 = off
  MaskParams mask;
  bool q_vec = false;    // q rows 16-byte aligned

  // Split > 1: partial results, (batch, kv_heads, rows, splits, head_dim) fp32 (normalised) and
  // (batch, kv_heads, rows, splits) natural-log LSEs; the combine kernel merges them into out / lse.
  float* part_o = nullptr;
  float* part_lse = nullptr;
  // Split > 1 on sm_90 with the splits launched as one cluster: merged in distributed shared memory instead
  // (cluster_merge.cuh; no partials in global memory, no combine kernel).
  bool cluster_merge = false;
  // K/V copies with an L2 evict-first policy: set for calls that read at least half the L2 (the plan, kv_plan.cpp),
  // whose K/V cannot stay resident until the next step anyway.
  bool kv_evict_first = false;
#if FLASHLITE_DECODE_TIMELINE
  // Diagnostic builds only (-DFLASHLITE_DECODE_TIMELINE=1, bench/decode/run_device.sh phase "timeline"): thread 0 of
  // every split block writes %globaltimer at kTimelineStamps points, (block, stamp) row-major; null = off.
  unsigned long long* timeline = nullptr;
#endif
};

}  // namespace flashlite::cuda_decode
