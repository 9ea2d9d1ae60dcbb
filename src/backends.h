#pragma once
// Entry points of every backend. Each receives a validated problem (src/dispatch.cpp) and trusts it.
#include <cstddef>
#include <string>

#include "common/backward_problem.h"
#include "common/problem.h"
#include "flashlite/attention.h"

namespace flashlite {

// The kernel forward() runs; chosen in exactly one place (choose_kernel in dispatch.cpp).
enum class KernelChoice { reference, cpu_naive, cpu_tiled, cuda_naive, cuda_fused };

void run_reference(const AttentionProblem& p);
void reference_compute(const AttentionProblem& p, double* out64, double* lse64);
void run_cpu_naive(const AttentionProblem& p);
void run_cpu_tiled(const AttentionProblem& p);
const char* cpu_tiled_variant();  // "avx512" / "avx2" / "portable": the code path run_cpu_tiled takes here
const char* cpu_tiled_variant(const AttentionProblem& p);  // the same for this problem (decode shapes may differ)

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
size_t cuda_naive_workspace_bytes(const AttentionProblem& p);
void run_cuda_naive(const AttentionProblem& p, void* stream, void* workspace, size_t workspace_bytes);
// Empty string when the fused kernel supports p; otherwise why not (e.g. "head_dim 48 is not one of 64, 128").
std::string cuda_fused_unsupported_reason(const AttentionProblem& p);
void run_cuda_fused(const AttentionProblem& p, void* stream);
std::string cuda_fused_kernel_name(const AttentionProblem& p);
// The CUDA backward (src/cuda/bwd/): empty string when it supports p, otherwise why not (names the dtype or
// head_dim); the kernel's name; its workspace; the run (all on `stream`, workspace allocated when null).
std::string cuda_backward_unsupported_reason(const BackwardProblem& p);
std::string cuda_backward_kernel_name(const BackwardProblem& p);
size_t cuda_backward_workspace_bytes(const BackwardProblem& p);
void run_cuda_backward(const BackwardProblem& p, void* stream, void* workspace, size_t workspace_bytes);
#endif

}  // namespace flashlite
