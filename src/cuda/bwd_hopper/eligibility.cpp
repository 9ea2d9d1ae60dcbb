// Host side of the Hopper backward that every CUDA build compiles (whether or not the 90a objects exist): the
// eligibility check and the name.
#include <climits>
#include <cstdint>
#include <string>

#include "cuda/bwd_hopper/bwd_hopper.h"
#include "cuda/common/tensor_map.h"
#include "cuda/fwd_hopper/hopper_fwd.h"  // tma_rows_ok

namespace flashlite::cuda_bwd_hopper {

std::string bwd_hopper_reject_reason(const BackwardProblem& bp, int cc) {
  const AttentionProblem& p = bp.fwd;
  if (cc != 90) return "the Hopper backward needs compute capability 9.0 (sm_90a code)";
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return "the Hopper backward takes float16 or bfloat16 only";
  if (p.head_dim != 64 && p.head_dim != 128) return "the Hopper backward takes head_dim 64 or 128 only";
  const cuda::MapRows maps = cuda::map_rows(p);  // the rows the tensor maps cover
  const int64_t tb = maps.batch, rows_q = maps.q, rows_k = maps.k;
  if (p.batch < 1 || rows_q <= 0 || rows_k <= 0) {
    return "the Hopper backward needs at least one sequence, query row and key row";
  }
  if (rows_q > INT32_MAX - 256 || rows_k > INT32_MAX - 256 || p.batch > INT32_MAX) {
    return "the Hopper backward addresses rows with 32-bit coordinates";
  }
  const int64_t row_blocks = (p.seq_q + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t key_blocks = (p.seq_k + kKeysPerBlock - 1) / kKeysPerBlock;
  if (p.q_heads * p.batch * row_blocks > INT32_MAX || p.kv_heads * p.batch * key_blocks > INT32_MAX) {
    return "the Hopper backward's grid would exceed 2^31 - 1 blocks";
  }
  if (!cuda_fwd_hopper::tma_rows_ok(p.q, p.q_stride, tb, p.q_heads) ||
      !cuda_fwd_hopper::tma_rows_ok(p.k, p.k_stride, tb, p.kv_heads) ||
      !cuda_fwd_hopper::tma_rows_ok(p.v, p.v_stride, tb, p.kv_heads) ||
      !cuda_fwd_hopper::tma_rows_ok(bp.dout, bp.dout_stride, tb, p.q_heads)) {
    return "the Hopper backward loads q, k, v and dout with TMA: 16-byte aligned base and strides needed";
  }
  // The epilogues store pairs of elements (4 bytes) straight from the accumulators.
  // Strides of dimensions of extent 1 never step.
  const auto pairs_ok = [&](const void* base, const RowStrides& s, int64_t rows, int64_t heads) {
    return reinterpret_cast<uintptr_t>(base) % 4 == 0 && (rows <= 1 || s.seq % 2 == 0) &&
           (heads <= 1 || s.head % 2 == 0) && (tb <= 1 || s.batch % 2 == 0);
  };
  if (!pairs_ok(bp.dq, bp.dq_stride, rows_q, p.q_heads) || !pairs_ok(bp.dk, bp.dk_stride, rows_k, p.kv_heads) ||
      !pairs_ok(bp.dv, bp.dv_stride, rows_k, p.kv_heads)) {
    return "the Hopper backward stores dq, dk and dv in 4-byte pairs: 4-byte aligned base and strides needed";
  }
  return {};
}

std::string bwd_hopper_kernel_name(const BackwardProblem& bp) {
  return std::string("cuda_backward_hopper_") + (bp.fwd.dtype == DType::f16 ? "f16" : "bf16") + "_d" +
         std::to_string(bp.fwd.head_dim);
}

}  // namespace flashlite::cuda_bwd_hopper
