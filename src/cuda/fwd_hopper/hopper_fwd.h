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

inline constexpr int kBlockRows = 128;  // query rows per CTA (two consumer warpgroups of 64 rows)
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
// "cuda_hopper_wgmma_bf16_d128_pingpong".
std::string hopper_fwd_kernel_name(const AttentionProblem& p);
// Launches the kernel. f: the fused kernel's parameters made for kBlockRows-row tiles, varlen tables filled. ctas:
// the persistent CTAs to launch (0: one per SM); never more than there are work tiles.
void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, int ctas, cudaStream_t stream);

}  // namespace flashlite::cuda_fwd_hopper
