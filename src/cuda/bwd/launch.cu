// Entry points of the CUDA backward (src/backends.h): the support check, whether the Hopper kernels take a call, the
// kernel's name, the workspace and the launch (bwd_kernels.cuh and src/cuda/bwd_hopper/ have the algorithm).
//
// Workspace (backward_workspace_bytes): [varlen offsets (2, batch + 1) int32][D: (tensor_batch, q_heads, rows_q)
// fp32][dsink shares: (batch, q_heads, q_tiles) fp32, with sink logits only], each part 256-byte aligned. When the
// caller passes none it is taken with cudaMallocAsync on the stream and released with cudaFreeAsync after the last
// kernel (stream-ordered, no host sync). Varlen offsets are host arrays in the API: copied into the workspace with
// one cudaMemcpyAsync (pageable source: staged before the call returns; refused under CUDA graph capture).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "backends.h"
#include "common/grid_order.h"
#include "cuda/bwd/bwd_launch.h"
#include "cuda/bwd_hopper/bwd_hopper.h"
#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/host_copy.h"
#include "cuda/fwd_hopper/hopper_fwd.h"  // hopper_fwd_built: the 90a objects are in this build

namespace flashlite {
namespace {

using cuda_bwd::BwdParams;

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Per q head: the dQ blocks' dsink shares summed in a fixed order (sequence, then q tile), in float64.
__global__ void bwd_dsink_kernel(const __grid_constant__ BwdParams p) {
  const int h = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (h >= p.q_heads) return;
  double sum = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int t = 0; t < p.q_tiles; ++t) sum += p.dsink_part[(int64_t(b) * p.q_heads + h) * p.q_tiles + t];
  p.dsink[h] = float(sum);
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Layout {
  size_t offsets = 0, delta = 0, dsink = 0, total = 0;  // byte offsets of each part, and the size
};

Layout workspace_layout(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const int64_t tb = p.varlen() ? 1 : p.batch;
  Layout l;
  size_t at = p.varlen() ? align_up(size_t(2 * (p.batch + 1)) * sizeof(int32_t)) : 0;
  l.delta = at;
  at += align_up(size_t(tb * p.q_heads * p.q_tensor_rows) * sizeof(float));
  l.dsink = at;
  if (bp.dsink) at += align_up(size_t(p.batch * p.q_heads * cdiv(p.seq_q, cuda_bwd::kBlockM)) * sizeof(float));
  l.total = at;
  return l;
}

const char* dtype_tag(DType t) { return t == DType::f16 ? "f16" : t == DType::bf16 ? "bf16" : "f32"; }

BwdParams make_params(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  BwdParams b;
  cuda::set_attention_tensors(b, p);
  b.dout = bp.dout, b.dq = bp.dq, b.dk = bp.dk, b.dv = bp.dv, b.dsink = bp.dsink;
  b.dout_stride = bp.dout_stride, b.dq_stride = bp.dq_stride, b.dk_stride = bp.dk_stride, b.dv_stride = bp.dv_stride;
  b.dlse = bp.dlse;
  b.dlse_stride = bp.dlse_stride;
  b.batch = int(p.batch);
  b.seq_q = int(p.seq_q);
  b.seq_k = int(p.seq_k);
  b.q_heads = int(p.q_heads);
  b.kv_heads = int(p.kv_heads);
  b.head_dim = int(p.head_dim);
  b.group = int(p.group_size());
  b.q_tiles = int(cdiv(p.seq_q, cuda_bwd::kBlockM));
  b.k_tiles = int(cdiv(p.seq_k, cuda_bwd::kBlockN));
  b.tensor_batch = int(p.varlen() ? 1 : p.batch);
  b.rows_q = p.q_tensor_rows;
  b.rows_k = bp.k_tensor_rows;
  b.scale = float(p.scale);
  if (p.softcap > 0) b.softcap = float(p.softcap);
  cuda::set_score_scaling(b, p);
  const int64_t tb = b.tensor_batch;
  b.vec_in = rows_16byte_aligned(p.q, p.q_stride, tb, p.q_heads) &&
             rows_16byte_aligned(p.k, p.k_stride, tb, p.kv_heads) &&
             rows_16byte_aligned(p.v, p.v_stride, tb, p.kv_heads) &&
             rows_16byte_aligned(bp.dout, bp.dout_stride, tb, p.q_heads);
  b.vec_out = rows_16byte_aligned(bp.dq, bp.dq_stride, tb, p.q_heads) &&
              rows_16byte_aligned(bp.dk, bp.dk_stride, tb, p.kv_heads) &&
              rows_16byte_aligned(bp.dv, bp.dv_stride, tb, p.kv_heads);
  b.mask = p.mask;
  // For the mma.sync grid's blocks; launch_bwd_hopper decides again for its own.
  b.sink_block_first = sink_block_leads(p.mask, p.seq_q, p.seq_k, cuda_bwd::kBlockM, cuda_bwd::kBlockN);
  return b;
}

}  // namespace

std::string cuda_backward_unsupported_reason(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return std::string("dtype ") + dtype_name(p.dtype) +
           " is unsupported by the CUDA backward; expected float16 or bfloat16 (on CUDA train a float32 model "
           "under torch.autocast, or in bf16; float32 gradients run on CPU tensors)";
  }
  if (p.head_dim > INT_MAX || !cuda_bwd::head_dim_supported(int(p.head_dim))) {
    return "head_dim " + std::to_string(p.head_dim) + " is unsupported by the CUDA backward; expected 64, 96 or 128";
  }
  if (p.seq_q > INT_MAX / 2 || p.seq_k > INT_MAX / 2 || p.q_tensor_rows > INT_MAX / 2 || bp.k_tensor_rows > INT_MAX / 2) {
    return "sequences longer than " + std::to_string(INT_MAX / 2) + " rows are unsupported by the CUDA backward";
  }
  const int64_t q_blocks = p.batch * p.q_heads * cdiv(p.seq_q, cuda_bwd::kBlockM);
  const int64_t k_blocks = p.batch * p.kv_heads * cdiv(p.seq_k, cuda_bwd::kBlockN);
  if (q_blocks > INT_MAX || k_blocks > INT_MAX) {
    return "batch * heads * tiles = " + std::to_string(std::max(q_blocks, k_blocks)) +
           " blocks is more than the CUDA backward's grid takes (" + std::to_string(INT_MAX) + ")";
  }
  return {};
}

std::string cuda_backward_hopper_reject_reason(const BackwardProblem& bp) {
  if (!cuda_fwd_hopper::hopper_fwd_built()) return "this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)";
  const int count = cuda::device_count();
  if (bp.fwd.device.index < 0 || bp.fwd.device.index >= count) return "no such CUDA device";
  return cuda_bwd_hopper::bwd_hopper_reject_reason(bp, cuda::device_props(bp.fwd.device.index).cc);
}

std::string cuda_backward_kernel_name(const BackwardProblem& bp, bool hopper) {
  if (hopper) return cuda_bwd_hopper::bwd_hopper_kernel_name(bp);
  return std::string("cuda_backward_mma_") + dtype_tag(bp.fwd.dtype) + "_d" + std::to_string(bp.fwd.head_dim);
}

size_t cuda_backward_workspace_bytes(const BackwardProblem& bp) { return workspace_layout(bp).total; }

void run_cuda_backward(const BackwardProblem& bp, bool hopper, void* stream_handle, void* workspace,
                       size_t workspace_bytes) {
  const AttentionProblem& p = bp.fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  cuda::DeviceGuard guard(p.device.index);
  const Layout lay = workspace_layout(bp);
  // Refused under graph capture before anything is enqueued (the workspace's stream-ordered allocation included).
  if (p.varlen()) cuda::refuse_host_copy_under_capture(stream, "the varlen offsets of the CUDA backward");
  cuda::CallBuffer owned(stream);
  char* base = cuda::call_workspace(owned, workspace, workspace_bytes, lay.total, "the CUDA backward",
                                    "backward_workspace_bytes");

  BwdParams b = make_params(bp);
  b.delta = reinterpret_cast<float*>(base + lay.delta);
  b.dsink_part = bp.dsink ? reinterpret_cast<float*>(base + lay.dsink) : nullptr;
  if (p.varlen()) {
    b.cu_q = cuda::copy_varlen_table(base, p.cu_seqlens_q, p.cu_seqlens_k, p.batch, stream);
    b.cu_k = b.cu_q + p.batch + 1;
  }

  const bool f16 = p.dtype == DType::f16;
  const auto zero_rows = [&](void* t, const RowStrides& st, int64_t from, int64_t rows, int64_t heads) {
    if (rows <= from) return;
    (f16 ? cuda_bwd::launch_zero_rows_f16 : cuda_bwd::launch_zero_rows_bf16)(t, st.seq, st.head, from, rows - from,
                                                                             int(heads), int(p.head_dim), stream);
  };
  if (p.varlen()) {  // rows past the last sequence get zero gradients
    zero_rows(bp.dq, bp.dq_stride, p.cu_seqlens_q[p.batch], p.q_tensor_rows, p.q_heads);
    zero_rows(bp.dk, bp.dk_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads);
    zero_rows(bp.dv, bp.dv_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads);
  }
  (f16 ? cuda_bwd::launch_delta_f16 : cuda_bwd::launch_delta_bf16)(b, stream);
  if (hopper) {
#if defined(FLASHLITE_FWD_HOPPER_BUILT) && FLASHLITE_FWD_HOPPER_BUILT
    cuda_bwd_hopper::launch_bwd_hopper(bp, b, stream);
#else
    throw Error(ErrorKind::runtime, "internal error: the Hopper backward was chosen in a build without sm_90a code");
#endif
  } else {
    (f16 ? cuda_bwd::launch_backward_f16 : cuda_bwd::launch_backward_bf16)(b, stream);
  }
  if (b.dsink) {
    bwd_dsink_kernel<<<unsigned((b.q_heads + 127) / 128), 128, 0, stream>>>(b);
    FL_CUDA_CHECK_LAUNCH("bwd_dsink_kernel");
  }
  FL_CUDA_CHECK(owned.free_now());
}

}  // namespace flashlite
