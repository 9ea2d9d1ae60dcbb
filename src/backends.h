#pragma once
// Entry points of every backend. Each receives a validated problem (src/dispatch.cpp) and its plan, and trusts them.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/backward_problem.h"
#include "common/problem.h"
#include "flashlite/attention.h"

namespace flashlite {

// The instruction set of the CPU tiled kernel's hot loops (src/cpu/tiled_*.cpp).
enum class CpuSimd : uint8_t { portable, avx2, avx512 };

// A forward plan with its launch parameters: made in exactly one place (plan_forward in dispatch.cpp; the CUDA fused
// kernels' part in plan_cuda_fused), read by the launchers and by the kernel names.
struct FwdPlan {
  ForwardKernel kernel = ForwardKernel::automatic;  // automatic: unsupported
  std::string unsupported;                          // why not (empty when supported)
  CpuSimd cpu_simd = CpuSimd::portable;             // cpu_tiled: its instruction set (plan_cpu_simd)
  int mma_config = 0;  // cuda_mma: cuda_fwd::MmaConfig
  int block_rows = 0;  // CUDA fused kernels: query rows per block
  int p_buffers = 0;   // cuda_hopper: P register buffers per consumer (hopper_shape, with block_rows)
  int rank_group = 0;  // CUDA fused, causal: (sequence, head) pairs per rank-major group (block_order.h; 0: one group)
  size_t fold_bytes = 0;  // CUDA tensor-core kernels, rows longer than cuda_fwd::kFoldKeys: their fold space
  int persistent_ctas = 0;  // cuda_hopper: the CTAs to launch (ForwardOverrides; 0: one per SM, fewer for few tiles)
};

void run_reference(const AttentionProblem& p);
void reference_compute(const AttentionProblem& p, double* out64, double* lse64);
void run_cpu_naive(const AttentionProblem& p);
void run_cpu_tiled(const AttentionProblem& p, CpuSimd simd);
// Every task of p takes the tiled kernel's small-q (decode) path where its build has one (src/cpu/tiled.cpp).
bool cpu_tiled_decode_shaped(const AttentionProblem& p);

// The planner's CPU instruction set (dispatch.cpp): FLASHLITE_CPU_SIMD or the best this CPU runs (read once per
// process; a forced level this CPU lacks is an error), and the one that runs p (decode shapes may take AVX2's).
CpuSimd cpu_simd_default();
CpuSimd plan_cpu_simd(const AttentionProblem& p);
const char* cpu_simd_name(CpuSimd simd);  // "avx512" / "avx2" / "portable"

// Forward's validation (src/dispatch.cpp), shared with backward's.
AttentionProblem validate_forward(const ForwardArgs& args);

// Backward (src/backward/): the float64 oracle writes contiguous float64 gradients shaped like q, k, v (rows outside
// every sequence zero) and dsink; any may be null.
void reference_backward_compute(const BackwardProblem& p, double* dq64, double* dk64, double* dv64, double* dsink64);
void run_backward_reference(const BackwardProblem& p);
void run_backward_cpu(const BackwardProblem& p);

// Largest head_dim per backend family.
inline constexpr int64_t kMaxCpuHeadDim = 512;

#if FLASHLITE_WITH_CUDA
struct KvCacheDesc;
size_t cuda_naive_workspace_bytes(const AttentionProblem& p);
void run_cuda_naive(const AttentionProblem& p, void* stream, void* workspace, size_t workspace_bytes);
// The CUDA fused kernels' part of the forward plan (src/cuda/fwd/plan.cpp): simt, mma.sync or Hopper and their tiles,
// or why not. forced: automatic or one of cuda_simt / cuda_mma / cuda_hopper. cache: prefill from this KV cache (the
// mma.sync kernel's cache variant).
FwdPlan plan_cuda_fused(const AttentionProblem& p, ForwardKernel forced, const KvCacheDesc* cache = nullptr);
void run_cuda_fused(const AttentionProblem& p, const FwdPlan& plan, void* stream, void* workspace, size_t workspace_bytes);
// The workspace run_cuda_fused takes from a caller (forward_workspace_bytes; src/cuda/fwd/launch.cu): the plan's fold
// space, then, when the plan is the Hopper kernel's and its tiles are of unequal work (causal, windows, varlen), the
// 4-byte tile counter of its dynamic schedule at the next 256-byte boundary. The counter is counted whatever the
// number of tiles and CTAs, so the size depends on the problem and the plan's kernel only.
size_t cuda_fused_workspace_bytes(const AttentionProblem& p, const FwdPlan& plan);
std::string cuda_fused_kernel_name(const AttentionProblem& p, const FwdPlan& plan);
// The CUDA backward (src/cuda/bwd/, src/cuda/bwd_hopper/): empty string when it supports p, otherwise why not (names
// the dtype or head_dim); why the Hopper kernels cannot run p on its device (empty: they can); the kernel's name; its
// workspace (the same for both families); the run (all on `stream`, workspace allocated when null).
std::string cuda_backward_unsupported_reason(const BackwardProblem& p);
std::string cuda_backward_hopper_reject_reason(const BackwardProblem& p);
std::string cuda_backward_kernel_name(const BackwardProblem& p, bool hopper);
size_t cuda_backward_workspace_bytes(const BackwardProblem& p);
void run_cuda_backward(const BackwardProblem& p, bool hopper, void* stream, void* workspace, size_t workspace_bytes);
#endif

}  // namespace flashlite
