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

}  // namespace flashlite::cuda
