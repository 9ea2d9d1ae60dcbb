#pragma once
// The Hopper forward kernel (wgmma + TMA, warp-specialised; src/cuda/fwd_hopper/) as seen from the fused backend's
// launcher (src/cuda/fwd/launch.cu). The default on sm_90 when the library was built with the 90a target and
// hopper_fwd_reject_reason() accepts the problem; otherwise (or with FLASHLITE_FWD_HOPPER=0) the mma.sync kernel runs.
#include <cuda_runtime.h>

#include <string>

#include "common/problem.h"
#include "cuda/fwd/fwd_params.h"

namespace flashlite::cuda_fwd_hopper {

inline constexpr int kBlockRows = 128;  // query rows per CTA (two consumer warpgroups of 64 rows)
inline constexpr int kBlockKeys = 128;  // keys per K/V tile

// True when the 90a objects are part of this build (CMAKE_CUDA_ARCHITECTURES lists 90a).
bool hopper_fwd_built();
// FLASHLITE_FWD_HOPPER in the environment, read once per process (the first call; parse_hopper_mode): 0 = off,
// 1 = the plain schedule, 2 = pipelined, 3 = pipelined + ping-pong (hopper_kernel.cuh, the default when unset).
int hopper_fwd_mode();
// The variable's value (nullptr: unset) as a mode; case-insensitive 0/off/false/no, 1, 2, 3/on/true/yes; anything
// else throws flashlite::Error (invalid_value) naming the variable, so a typo never silently picks a kernel.
int parse_hopper_mode(const char* value);
inline bool hopper_fwd_enabled() { return hopper_fwd_mode() != 0; }
// Why the Hopper kernel cannot run p on a device of compute capability cc (major * 10 + minor); empty when it can.
// Pure host logic on the problem's shapes, dtypes, pointers and strides (unit-tested in tests/gpu/hopper_fwd_test.cpp).
std::string hopper_fwd_reject_reason(const AttentionProblem& p, int cc);
// "cuda_hopper_wgmma_bf16_d128" (mode 1), "..._pipe" (mode 2), "..._pingpong" (mode 3).
std::string hopper_fwd_kernel_name(const AttentionProblem& p, int mode);
// Launches the kernel (mode 1, 2 or 3). f: the fused kernel's parameters made for kBlockRows-row tiles, varlen tables
// filled.
void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, int mode, cudaStream_t stream);

}  // namespace flashlite::cuda_fwd_hopper
