// Entry points of the split ("naive") CUDA backend (src/backends.h): the seeds' three textbook steps as four kernel
// launches per call, over an explicit S x S fp32 workspace.
//
//   1. scores_kernel      S = Q K^T                  batched tiled GEMM (gemm_nt.cu)
//   2. scale_mask_kernel  S = mask(softcap(scale S))  elementwise      (softmax.cu)
//   3. softmax_kernel     P = softmax(S), LSE          one block a row  (softmax.cu)
//   4. pv_kernel          O = P V                     batched tiled GEMM (gemm_nn.cu)
//
// Workspace (query it with forward_workspace_bytes): [varlen offsets, 256-byte aligned][S: (batch * q_heads, seq_q,
// seq_k) fp32]. When the caller passes none, it is taken with cudaMallocAsync on the stream and released with
// cudaFreeAsync after the last kernel (stream-ordered, no host sync; but not capturable in a CUDA graph unless the
// graph allows memory nodes, so graph users pass a workspace). Varlen offsets are host arrays in the API: they are
// copied into the workspace with one cudaMemcpyAsync (pageable source: staged before the call returns; refused under
// graph capture, which could not replay it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "backends.h"
#include "cuda/common/check.h"
#include "cuda/common/host_copy.h"
#include "cuda/common/dtype.cuh"
#include "cuda/naive/naive_params.h"

namespace flashlite {
namespace {

using cuda_naive::NaiveParams;

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t offsets_bytes(const AttentionProblem& p) {
  return p.varlen() ? align_up(size_t(2 * (p.batch + 1)) * sizeof(int32_t)) : 0;
}

// (batch * q_heads, seq_q, seq_k) fp32, with an overflow check (a naive S x S buffer grows quadratically).
size_t scores_bytes(const AttentionProblem& p) {
  const unsigned __int128 n = (unsigned __int128)(p.batch * p.q_heads) * uint64_t(p.seq_q) * uint64_t(p.seq_k) * 4u;
  if (n > (unsigned __int128)(SIZE_MAX / 2)) {
    throw Error(ErrorKind::invalid_value, "backend 'naive' would need a " + std::to_string(p.batch * p.q_heads) +
                                              " x " + std::to_string(p.seq_q) + " x " + std::to_string(p.seq_k) +
                                              " fp32 score buffer, which does not fit in memory; use backend 'cuda'");
  }
  return size_t(n);
}

// The kernels' parameters: the problem, and the score buffer in the workspace.
NaiveParams make_params(const AttentionProblem& p, float* scores) {
  NaiveParams n;
  cuda::set_attention_tensors(n, p);
  n.s = scores;
  n.batch = p.batch;
  n.seq_q = p.seq_q;
  n.seq_k = p.seq_k;
  n.q_heads = p.q_heads;
  n.group = p.group_size();
  n.head_dim = p.head_dim;
  n.scale = float(p.scale);
  n.softcap = float(p.softcap);
  n.mask = p.mask;
  return n;
}

}  // namespace

size_t cuda_naive_workspace_bytes(const AttentionProblem& p) { return offsets_bytes(p) + scores_bytes(p); }

void run_cuda_naive(const AttentionProblem& p, void* stream_handle, void* workspace, size_t workspace_bytes) {
  if (p.seq_q > INT_MAX) {
    throw Error(ErrorKind::invalid_value, "seq_q " + std::to_string(p.seq_q) + " is too long for backend 'naive' on CUDA; expected at most " + std::to_string(INT_MAX));
  }
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  cuda::DeviceGuard guard(p.device.index);
  const size_t need = cuda_naive_workspace_bytes(p);
  // Refused under graph capture before anything is enqueued (the workspace's stream-ordered allocation included).
  if (p.varlen()) cuda::refuse_host_copy_under_capture(stream, "the varlen offsets of the naive path");
  cuda::CallBuffer owned(stream);  // freed when the call ends (stream-ordered)
  char* base =
      cuda::call_workspace(owned, workspace, workspace_bytes, need, "backend 'naive'", "forward_workspace_bytes");
  NaiveParams n = make_params(p, reinterpret_cast<float*>(base + offsets_bytes(p)));
  if (p.varlen()) {
    n.cu_q = cuda::copy_varlen_table(base, p.cu_seqlens_q, p.cu_seqlens_k, p.batch, stream);
    n.cu_k = n.cu_q + p.batch + 1;
  }

  cuda::dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda_naive::launch_scores<T>(n, stream);
    cuda_naive::launch_scale_mask(n, stream);
    cuda_naive::launch_softmax(n, stream);
    cuda_naive::launch_pv<T>(n, stream);
  });
}

}  // namespace flashlite
