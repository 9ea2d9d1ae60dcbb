#pragma once
// TMA tensor maps of [batch, seq, heads, head_dim] views for the sm_90a kernels (the Hopper forward and backward).
// Encoded on the host per call (cuTensorMapEncodeTiled, reached through the runtime's driver entry-point query, so
// the library does not link libcuda) and passed by value in kernel parameters: no device allocation, no host sync,
// graph-capturable.
#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "common/problem.h"

namespace flashlite::cuda {

// A 4-D map (head_dim, rows, heads, batch) of a 16-bit [batch, seq, heads, head_dim] view; boxes of 64 columns x
// box_rows rows of one head of one batch entry, 128-byte swizzle (the wgmma descriptors' layout), rows past `rows`
// read as zeros. Throws flashlite::Error (runtime) starting with `who` and naming `name` and the arguments when the
// driver refuses the map.
CUtensorMap make_tile_map(const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                          const RowStrides& s, int box_rows, const char* name, const char* who);

// The rows a problem's maps cover: padded, seq_q / seq_k rows of each of `batch` entries; varlen, one tensor "batch"
// of rows up to the last sequence's end. Rows past them (past a padded sequence, after the last varlen one) read as
// zeros; inside a varlen batch a tile that crosses a sequence's end holds the next sequence's rows.
struct MapRows {
  int64_t batch, q, k;
};
MapRows map_rows(const AttentionProblem& p);

// The maps of q, k and v: boxes of q_box rows for q, kv_box rows for k and v.
struct AttentionMaps {
  CUtensorMap q, k, v;
};
AttentionMaps make_attention_maps(const AttentionProblem& p, int q_box, int kv_box, const char* who);

}  // namespace flashlite::cuda
