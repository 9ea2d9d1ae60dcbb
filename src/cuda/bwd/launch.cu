// Entry points of the CUDA backward (src/backends.h): the support check, the kernel's name, the workspace and the
// launch (bwd_kernels.cuh has the algorithm).
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
#include <vector>

#include "backends.h"
#include "cuda/bwd/bwd_launch.h"
#include "cuda/common/check.h"
#include "cuda/common/host_copy.h"

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

bool rows_aligned16(const void* base, const BSHStrides& s, int64_t batch, int64_t heads) {
  const auto ok = [](int64_t stride) { return (stride * 2) % 16 == 0; };  // 2-byte elements
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && ok(s.seq) && (batch <= 1 || ok(s.batch)) &&
         (heads <= 1 || ok(s.head));
}

const char* dtype_tag(DType t) { return t == DType::f16 ? "f16" : t == DType::bf16 ? "bf16" : "f32"; }

BwdParams make_params(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  BwdParams b;
  b.q = p.q, b.k = p.k, b.v = p.v, b.out = p.out, b.dout = bp.dout, b.lse = p.lse, b.sink_logits = p.sink_logits;
  b.dq = bp.dq, b.dk = bp.dk, b.dv = bp.dv, b.dsink = bp.dsink;
  b.q_sb = p.q_stride.batch, b.q_ss = p.q_stride.seq, b.q_sh = p.q_stride.head;
  b.k_sb = p.k_stride.batch, b.k_ss = p.k_stride.seq, b.k_sh = p.k_stride.head;
  b.v_sb = p.v_stride.batch, b.v_ss = p.v_stride.seq, b.v_sh = p.v_stride.head;
  b.o_sb = p.out_stride.batch, b.o_ss = p.out_stride.seq, b.o_sh = p.out_stride.head;
  b.do_sb = bp.dout_stride.batch, b.do_ss = bp.dout_stride.seq, b.do_sh = bp.dout_stride.head;
  b.dq_sb = bp.dq_stride.batch, b.dq_ss = bp.dq_stride.seq, b.dq_sh = bp.dq_stride.head;
  b.dk_sb = bp.dk_stride.batch, b.dk_ss = bp.dk_stride.seq, b.dk_sh = bp.dk_stride.head;
  b.dv_sb = bp.dv_stride.batch, b.dv_ss = bp.dv_stride.seq, b.dv_sh = bp.dv_stride.head;
  b.lse_sb = p.lse_stride_batch, b.lse_sh = p.lse_stride_head, b.lse_ss = p.lse_stride_seq;
  b.dlse = bp.dlse;
  b.dlse_sb = bp.dlse_stride_batch, b.dlse_sh = bp.dlse_stride_head, b.dlse_ss = bp.dlse_stride_seq;
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
  const double log2e = 1.4426950408889634;
  b.scale = float(p.scale);
  b.scale_log2 = float(p.scale * log2e);
  if (p.softcap > 0) {
    b.softcap = float(p.softcap);
    b.softcap_pre = float(p.scale / p.softcap);
    b.softcap_post = float(p.softcap * log2e);
  }
  const int64_t tb = b.tensor_batch;
  b.vec_in = rows_aligned16(p.q, p.q_stride, tb, p.q_heads) && rows_aligned16(p.k, p.k_stride, tb, p.kv_heads) &&
             rows_aligned16(p.v, p.v_stride, tb, p.kv_heads) && rows_aligned16(bp.dout, bp.dout_stride, tb, p.q_heads);
  b.vec_out = rows_aligned16(bp.dq, bp.dq_stride, tb, p.q_heads) &&
              rows_aligned16(bp.dk, bp.dk_stride, tb, p.kv_heads) && rows_aligned16(bp.dv, bp.dv_stride, tb, p.kv_heads);
  b.mask = p.mask;
  return b;
}

}  // namespace

std::string cuda_backward_unsupported_reason(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return std::string("dtype ") + dtype_name(p.dtype) +
           " is unsupported by the CUDA backward; expected float16 or bfloat16 (float32 gradients: use CPU tensors)";
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

std::string cuda_backward_kernel_name(const BackwardProblem& bp) {
  return std::string("cuda_backward_mma_") + dtype_tag(bp.fwd.dtype) + "_d" + std::to_string(bp.fwd.head_dim);
}

size_t cuda_backward_workspace_bytes(const BackwardProblem& bp) { return workspace_layout(bp).total; }

void run_cuda_backward(const BackwardProblem& bp, void* stream_handle, void* workspace, size_t workspace_bytes) {
  const AttentionProblem& p = bp.fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  cuda::DeviceGuard guard(p.device.index);
  const Layout lay = workspace_layout(bp);
  cuda::CallBuffer owned(stream);
  if (workspace == nullptr) {
    if (lay.total > 0) FL_CUDA_CHECK(cudaMallocAsync(&owned.ptr, lay.total, stream));
    workspace = owned.ptr;
  } else if (workspace_bytes < lay.total) {
    throw Error(ErrorKind::invalid_value, "workspace has " + std::to_string(workspace_bytes) +
                                              " bytes; the CUDA backward needs " + std::to_string(lay.total) +
                                              " for these shapes (see backward_workspace_bytes)");
  } else if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw Error(ErrorKind::invalid_value, "workspace is not 16-byte aligned; expected an allocation's start address");
  }
  auto* base = static_cast<char*>(workspace);

  BwdParams b = make_params(bp);
  b.delta = reinterpret_cast<float*>(base + lay.delta);
  b.dsink_part = bp.dsink ? reinterpret_cast<float*>(base + lay.dsink) : nullptr;
  if (p.varlen()) {
    cuda::refuse_host_copy_under_capture(stream, "the varlen offsets of the CUDA backward");
    std::vector<int32_t> host(size_t(2 * (p.batch + 1)));  // (2, batch + 1): cu_seqlens_q then cu_seqlens_k
    for (int64_t i = 0; i <= p.batch; ++i) {
      host[size_t(i)] = p.cu_seqlens_q[i];
      host[size_t(p.batch + 1 + i)] = p.cu_seqlens_k[i];
    }
    FL_CUDA_CHECK(cudaMemcpyAsync(base, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    b.cu_q = reinterpret_cast<const int*>(base);
    b.cu_k = b.cu_q + p.batch + 1;
  }

  const bool f16 = p.dtype == DType::f16;
  const auto zero_rows = [&](void* t, const BSHStrides& st, int64_t from, int64_t rows, int64_t heads) {
    if (rows <= from) return;
    (f16 ? cuda_bwd::launch_zero_rows_f16 : cuda_bwd::launch_zero_rows_bf16)(t, st.seq, st.head, from, rows - from,
                                                                             int(heads), int(p.head_dim), stream);
  };
  if (p.varlen()) {  // rows past the last sequence get zero gradients
    zero_rows(bp.dq, bp.dq_stride, p.cu_seqlens_q[p.batch], p.q_tensor_rows, p.q_heads);
    zero_rows(bp.dk, bp.dk_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads);
    zero_rows(bp.dv, bp.dv_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads);
  }
  if (f16) {
    cuda_bwd::launch_backward_f16(b, stream);
  } else {
    cuda_bwd::launch_backward_bf16(b, stream);
  }
  if (b.dsink) {
    bwd_dsink_kernel<<<unsigned((b.q_heads + 127) / 128), 128, 0, stream>>>(b);
    FL_CUDA_CHECK_LAUNCH("bwd_dsink_kernel");
  }
  FL_CUDA_CHECK(owned.free_now());
}

}  // namespace flashlite
