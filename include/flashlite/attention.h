#pragma once
// The public attention API.
//
// Layout: q [batch, seq_q, q_heads, head_dim], k/v [batch, seq_k, kv_heads, head_dim], out like q.
// Any batch/seq/head strides; head_dim must be contiguous (stride 1).
// Variable-length batches: pass cu_seqlens_q / cu_seqlens_k (int32, [batch + 1], cumulative offsets,
// on the CPU) and tensors of shape [1, total_tokens, heads, head_dim]; sequence b owns the rows
// cu_seqlens[b] .. cu_seqlens[b+1]-1.
//
// Mask semantics (one predicate, src/common/mask.h, shared by every backend). For query row i and key j of a
// sequence with lengths (Sq, Sk), the query sits at key position p = i + (Sk - Sq) (bottom-right alignment,
// as FlashAttention-2: the last query sees the last key). Key j is visible when
//   (!causal || j <= p)  and  ( (window_left < 0 || j >= p - window_left) && (window_right < 0 || j <= p + window_right)
//                               || j < sink_tokens )
// i.e. sink tokens bypass the sliding window but never the causal mask.
// Scores: s = scale * q.k, then softcap * tanh(s / softcap) when softcap > 0.
// Learned sink logits (per q head, fp32, natural-log units) join the softmax denominator only.
// LSE (fp32, [batch, q_heads, seq_q]; varlen: [1, q_heads, total_q]) = log(sum_visible exp(s) + exp(sink_logit)).
// A row with no visible key gets out = 0 and LSE = -inf (or the sink logit when sink logits are given).
//
// Non-finite values follow IEEE arithmetic as PyTorch's math SDPA does, except that masked keys do not matter, on every
// backend (docs/numerics.md has the cases and torch's answers):
//   - scores of visible keys are computed as above, so a NaN / +-inf in q or in a visible K row gives NaN / +-inf
//     scores (softcap maps +-inf to +-softcap);
//   - a NaN or +inf score, or a NaN or +inf sink logit, makes the row's whole output and its LSE NaN;
//   - a -inf score weighs 0; a row whose visible scores are all -inf is a row with no visible key (see above);
//     a -inf sink logit means no sink;
//   - a NaN / +-inf V element of a visible key reaches only its own output column (NaN, or +-inf; NaN where its weight
//     is 0 or infinities of both signs meet), never the LSE;
//   - the K rows of masked keys never matter; a NaN / +-inf V element of a masked key never reaches the LSE or another
//     column, and on the CPU backends nothing at all, while the CUDA kernels may turn that column NaN in rows of the
//     same sequence and head group (their masked weight 0 times the element, as torch SDPA and FlashAttention do).
// Long rows: the accumulation error does not grow with the row length. The CPU backends and fp32 on CUDA fold fp32
// sums over about 2048 keys into float64; the fp16 / bf16 CUDA kernels fold their tensor-core accumulators into fp32
// every 32768 keys (a workspace when seq_k > 32768, see ForwardArgs::workspace; docs/numerics.md).
#include <optional>
#include <string>

#include "flashlite/tensor.h"

namespace flashlite {

enum class Backend {
  automatic,  // cpu for CPU tensors, cuda for CUDA tensors
  reference,  // float64, the three textbook steps; CPU only; the oracle for tests
  naive,      // three steps with an explicit S x S fp32 buffer (CPU, or split kernels on CUDA)
  cpu,        // tiled FlashAttention-2 style kernel on the CPU
  cuda,       // fused kernel on the GPU
};

const char* backend_name(Backend backend);
// Parses "auto", "reference", "naive", "cpu", "cuda"; throws Error naming the value otherwise.
Backend parse_backend(const std::string& name);

struct AttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  bool causal = false;          // bottom-right aligned when seq_q != seq_k
  int window_left = -1;         // -1 = unlimited
  int window_right = -1;        // -1 = unlimited
  int sink_tokens = 0;          // first N keys stay visible regardless of the window
  TensorView sink_logits;       // optional fp32 [q_heads], same device as q
  double softcap = 0.0;         // 0 = off
  TensorView cu_seqlens_q;      // optional int32 [batch + 1] (CPU memory)
  TensorView cu_seqlens_k;      // optional int32 [batch + 1] (CPU memory)
};

// The kernels forward() may run. plan_forward() picks one (the same function answers "supported?" and names it).
enum class ForwardKernel {
  automatic,    // in ForwardOverrides: the planner's choice; in a plan: none (unsupported)
  reference,    // CPU float64 oracle
  cpu_naive,    // CPU three steps with an S x S buffer
  cpu_tiled,    // CPU tiled FlashAttention-2 (its SIMD build: FLASHLITE_CPU_SIMD or the CPU's best)
  cuda_naive,   // CUDA split kernels (GEMM, softmax, GEMM) with a workspace
  cuda_simt,    // CUDA fused fp32 kernel (CUDA cores)
  cuda_mma,     // CUDA fused mma.sync tensor-core kernel (sm_80+; fp16 / bf16)
  cuda_hopper,  // CUDA fused wgmma + TMA kernel, ping-pong consumers (sm_90a; fp16 / bf16, head_dim 64 / 128)
};
const char* forward_kernel_kind(ForwardKernel kernel);  // "cuda_mma", ...

// Tests and benchmarks force a kernel here; the default choice needs none.
struct ForwardOverrides {
  ForwardKernel kernel = ForwardKernel::automatic;  // must agree with ForwardArgs::backend
  // The CTAs a persistent kernel (cuda_hopper) launches, each walking work tiles; 0: the planner's (one per SM).
  // Other kernels ignore it. Negative values are refused.
  int persistent_ctas = 0;
};

// What forward() runs for given arguments: the kernel, its readable name and workspace, or why nothing can run them.
struct ForwardPlan {
  ForwardKernel kernel = ForwardKernel::automatic;
  std::string unsupported;  // non-empty: no kernel (or not the forced one) can run these arguments, and why
  std::string name;         // e.g. "cuda_fused_mma_bf16_d128_br128_bc64_w4_s2_f3" (forward_kernel_name)
  size_t workspace_bytes = 0;
  ForwardOverrides overrides;  // what it was planned under (forward() with this plan plans again under them)
  bool supported() const { return unsupported.empty(); }
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView lse;  // optional fp32 [batch, q_heads, seq_q]
  AttentionOptions options;
  Backend backend = Backend::automatic;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
  // Scratch memory on the tensors' device for backends that need it (CUDA naive; the CUDA tensor-core kernels when
  // seq_k > 32768: fp32 sums of rows that long, about 4 bytes per output element; the Hopper kernel on causal, window
  // or varlen calls: its 4-byte tile counter); query its size with forward_workspace_bytes(), 16-byte aligned. When
  // absent such a backend allocates (and frees) it itself, stream-ordered: memory nodes under CUDA graph capture,
  // where a workspace gives none.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // null: planned here; else the overrides of this plan apply (a plan of plan_forward(args, overrides)).
  const ForwardPlan* plan = nullptr;
};

// Validates every argument (throws Error on a bad one), then picks the kernel: the default choice, or the one the
// overrides force. Arguments no kernel (or not the forced one) can run give a plan with `unsupported` set, the reason
// forward() would throw. FLASHLITE_FWD_HOPPER=0 (read once) takes the mma.sync kernel where the Hopper kernel would run.
ForwardPlan plan_forward(const ForwardArgs& args, const ForwardOverrides& overrides = {});

// Validates every argument and plans (throws Error, nothing is written; unsupported: the plan's reason), then runs.
void forward(const ForwardArgs& args);

// The float64 oracle (CPU tensors only): writes contiguous float64 buffers shaped like q
// ([batch, seq_q, q_heads, head_dim]) and lse ([batch, q_heads, seq_q]); either may be null. args.out is validated but
// not written. Rows outside every varlen sequence are not written.
void reference_forward_f64(const ForwardArgs& args, double* out, double* lse);

// Convenience overload.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options, Backend backend = Backend::automatic,
             void* stream = nullptr);

// Bytes of workspace the chosen backend needs for these arguments (0 for most). Validates the arguments.
size_t forward_workspace_bytes(const ForwardArgs& args);

// Which kernel forward() would run, as a readable name (e.g. "cpu_tiled_avx2"): plan_forward(args).name; throws
// the reason when unsupported.
std::string forward_kernel_name(const ForwardArgs& args);

}  // namespace flashlite
