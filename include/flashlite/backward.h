#pragma once
// The backward pass of forward() (attention.h): given dout, the gradient of a scalar loss with respect to out, writes
// the gradients with respect to q, k, v and, when the forward had learned sink logits, with respect to them.
//
//   P = softmax over the visible keys and the sink of the (softcapped) scores, out = P V, for each row i:
//   dV_j  = sum_i P_ij dout_i                         D_i = dout_i . out_i
//   dS_ij = P_ij (dout_i . v_j - D_i)                 (times 1 - tanh^2 of the softcap's argument when softcap > 0)
//   dq_i  = scale sum_j dS_ij k_j                     dk_j = scale sum_i dS_ij q_i
//   dsink_h = -sum_i exp(sink_h - lse_i) D_i           (over every row of q head h)
// GQA: dk and dv of a kv head sum the contributions of all the q heads of its group. Rows and keys that no sequence
// covers (varlen padding) get zero gradients. When the loss also depends on lse, its gradient dlse joins as
// D_i - dlse_i in place of D_i (d lse_i / d s_ij = P_ij, d lse_i / d sink = exp(sink - lse_i)).
//
// Tensors follow forward's rules ([batch, seq, heads, head_dim], any batch / seq / head strides, varlen through
// options.cu_seqlens_q/k): dq is shaped like q, dk and dv like k and v, all in q's dtype; dout like out. Every bad
// argument is named in an Error and nothing is written. Non-finite values propagate as IEEE arithmetic has it.
//
// Backends: 'reference' and 'cpu' (CPU tensors, any dtype); 'cuda' (automatic for CUDA tensors): float16 / bfloat16
// with head_dim 64, 96 or 128 on sm_80 and newer (tensor cores, fp32 accumulation); other dtypes or head dims are
// refused with an error naming them. On sm_90 the Hopper kernels (wgmma, TMA; head_dim 64 or 128, TMA-addressable
// tensors) take the calls they accept.
#include <string>

#include "flashlite/attention.h"

namespace flashlite {

// The kernels backward() may run; the planner picks one per call.
enum class BackwardKernel {
  automatic,    // in BackwardOverrides: the planner's choice
  reference,    // CPU float64 oracle
  cpu_tiled,    // CPU tiled FlashAttention-2 backward
  cuda_mma,     // CUDA mma.sync tensor-core kernels (sm_80+; fp16 / bf16)
  cuda_hopper,  // CUDA wgmma + TMA kernels (sm_90a; fp16 / bf16, head_dim 64 / 128)
};

// Tests and benchmarks force a kernel here; the default choice needs none. A forced kernel that cannot run the call
// (or that the backend excludes) is an Error naming why.
struct BackwardOverrides {
  BackwardKernel kernel = BackwardKernel::automatic;
};

struct BackwardArgs {
  TensorView q, k, v;     // the forward's inputs
  TensorView out;         // the forward's output
  TensorView lse;         // required: fp32 [batch, q_heads, seq_q] (varlen [1, q_heads, total_q]) as forward wrote it
  TensorView dout;        // gradient of the loss with respect to out, shaped like out
  TensorView dlse;        // optional: gradient of the loss with respect to lse, fp32 shaped like lse
  TensorView dq, dk, dv;  // outputs, shaped like q, k, v
  // Output, fp32 [q_heads]: required when options.sink_logits is given, absent otherwise. Overwritten, not added to.
  TensorView dsink_logits;
  AttentionOptions options;  // the forward's options
  Backend backend = Backend::automatic;
  // Gradients bitwise identical from run to run. Every backend always is: the CPU backends sum in a fixed order
  // whatever the thread count, and the CUDA backward uses no atomics (dK/dV and dQ are computed by separate kernels,
  // each block owning what it writes; dsink's per-block shares are summed in a fixed order), so this is honoured
  // at no cost.
  bool deterministic = false;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
  // Scratch memory on the tensors' device for backends that need it; size from backward_workspace_bytes(). When
  // absent such a backend allocates (and frees) it itself.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Validates every argument (throws Error, nothing is written), picks the kernel and runs it.
void backward(const BackwardArgs& args, const BackwardOverrides& overrides = {});

// Bytes of workspace the chosen kernel needs for these arguments (0 for the CPU backends). Validates the arguments.
size_t backward_workspace_bytes(const BackwardArgs& args, const BackwardOverrides& overrides = {});

// Which kernel backward() would run, as a readable name (e.g. "cuda_backward_hopper_bf16_d128"). Validates the
// arguments.
std::string backward_kernel_name(const BackwardArgs& args, const BackwardOverrides& overrides = {});

// The float64 oracle (CPU tensors only): recomputes the forward in float64 from q, k, v and the sink logits (out and
// lse are validated but not read) and writes contiguous float64 gradients shaped like q, k, v ([batch, rows, heads,
// head_dim]) and dsink ([q_heads]); any of them may be null. args.dq/dk/dv are validated but not written.
void reference_backward_f64(const BackwardArgs& args, double* dq, double* dk, double* dv, double* dsink);

}  // namespace flashlite
