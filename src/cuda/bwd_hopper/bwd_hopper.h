#pragma once
// The Hopper backward kernels (wgmma + TMA, warp-specialised; src/cuda/bwd_hopper/) as seen from the CUDA backward's
// entry points (src/cuda/bwd/launch.cu) and the backward planner (src/backward/api.cpp). They run where the library
// was built with the 90a target and bwd_hopper_reject_reason() accepts the problem, unless BackwardOverrides forces the
// mma.sync kernels of src/cuda/bwd/.
#include <cuda_runtime.h>

#include <string>

#include "common/backward_problem.h"
#include "cuda/bwd/bwd_params.h"

namespace flashlite::cuda_bwd_hopper {

inline constexpr int kKeysPerBlock = 128;  // dK/dV kernel: keys per CTA (two consumer warpgroups of 64 keys)
inline constexpr int kRowsPerBlock = 128;  // dQ kernel: query rows per CTA (two consumer warpgroups of 64 rows)

// Why the Hopper backward cannot run p on a device of compute capability cc (major * 10 + minor); empty when it
// can. Pure host logic on the problem's shapes, dtypes, pointers and strides (unit-tested without a GPU).
std::string bwd_hopper_reject_reason(const BackwardProblem& p, int cc);
// "cuda_backward_hopper_bf16_d128".
std::string bwd_hopper_kernel_name(const BackwardProblem& p);
// Launches the dK/dV and dQ kernels on `stream`. b: the backward's parameters with the workspace set and D already
// computed (bwd_delta_kernel) on the same stream.
void launch_bwd_hopper(const BackwardProblem& p, const cuda_bwd::BwdParams& b, cudaStream_t stream);

}  // namespace flashlite::cuda_bwd_hopper
