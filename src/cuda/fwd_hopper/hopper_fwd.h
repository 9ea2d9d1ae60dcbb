#pragma once
// The Hopper forward kernel (wgmma + TMA, warp-specialised; src/cuda/fwd_hopper/) as seen from the fused backend's
// launcher (src/cuda/fwd/launch.cu) and planner (src/cuda/fwd/plan.cpp). The default on sm_90 when the library was built
// with the 90a target and hopper_fwd_reject_reason() accepts the problem; otherwise (or with FLASHLITE_FWD_HOPPER=0)
// the mma.sync kernel runs.
#include <cuda_runtime.h>

#include <string>

#include "common/problem.h"
#include "cuda/fwd/fwd_params.h"

namespace flashlite::cuda_fwd_hopper {

// The kernel's shape for a problem (each choice the measured winner on the H100, docs/performance.md):
//   block_rows  query rows per work tile, 64 per consumer warpgroup: 192 (three warpgroups) at head_dim 64, where each
//               score's exp2 costs as much as its share of the GEMMs and a third warpgroup's softmax fills the tensor
//               cores' gaps (FlashAttention-3's choice), except for causal or windowed rows of up to 4096 queries,
//               where a 192-row tile's diagonal masks twice the keys of a 128-row one; else 128 (D128 has no
//               registers for a third warpgroup);
//   p_buffers   P register buffers per consumer: 2 lets P(n) be packed while P(n-1) V(n-1) still runs (the shorter
//               chain per key tile); 1 frees 32 registers, which three warpgroups need and which at D128 removes the
//               spills of each work tile's setup, the better trade up to 2048 keys.
struct HopperShape {
  int block_rows, p_buffers;
};
HopperShape hopper_shape(const AttentionProblem& p);
inline constexpr int kBlockKeys = 128;  // keys per K/V tile

// True when the 90a objects are part of this build (CMAKE_CUDA_ARCHITECTURES lists 90a).
bool hopper_fwd_built();
// FLASHLITE_FWD_HOPPER's value (nullptr: unset) as "use the Hopper kernel where it can run": unset, empty or 1 = yes
// (the default), 0 = no (the mma.sync kernel); anything else throws flashlite::Error (invalid_value) naming the
// variable, so a typo never silently picks a kernel. The planner (src/cuda/fwd/plan.cpp) reads the variable once.
bool parse_fwd_hopper_setting(const char* value);
// Why the Hopper kernel cannot run p on a device of compute capability cc (major * 10 + minor); empty when it can.
// Pure host logic on the problem's shapes, dtypes, pointers and strides (unit-tested in tests/gpu/hopper_fwd_test.cpp).
std::string hopper_fwd_reject_reason(const AttentionProblem& p, int cc);
// Whether TMA can address the rows of a [batch, seq, heads, head_dim] view of 16-bit elements: 16-byte aligned base,
// every stride of a dimension longer than one a positive multiple of 16 bytes (below 2^40).
bool tma_rows_ok(const void* base, const RowStrides& s, int64_t batch, int64_t heads);
// "cuda_hopper_wgmma_bf16_d128_128x128_p2_pingpong" (tile rows x keys, P buffers) for the planned shape.
std::string hopper_fwd_kernel_name(const AttentionProblem& p, HopperShape shape);
// The persistent grid for f's work tiles: `ctas` (0: one per SM of `device`), never more than there are tiles.
int hopper_grid(const cuda_fwd::FwdParams& f, int ctas, int device);
// Whether that grid takes the dynamic schedule: tiles of unequal work (causal, windows, varlen) and more of them than
// CTAs. Only then does the kernel use the workspace's tile counter.
bool hopper_dynamic_schedule(const AttentionProblem& p, const cuda_fwd::FwdParams& f, int grid);
// Launches the kernel of the planned shape (hopper_shape). f: the fused kernel's parameters made for its block_rows,
// varlen tables filled; f.tile_counter_space: 4 bytes for the dynamic schedule's counter where hopper_dynamic_schedule
// (launch.cu). ctas: the plan's persistent CTAs (0: one per SM), clamped by hopper_grid.
void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, HopperShape shape, int ctas,
                       cudaStream_t stream);

}  // namespace flashlite::cuda_fwd_hopper
