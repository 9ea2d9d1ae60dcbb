// Host side of the Hopper forward kernel that every CUDA build compiles (whether or not the 90a objects exist):
// the eligibility check and the name.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/device_props.h"
#include "cuda/common/tensor_map.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/errors.h"

namespace flashlite::cuda_fwd_hopper {

bool hopper_fwd_built() {
#if defined(FLASHLITE_FWD_HOPPER_BUILT) && FLASHLITE_FWD_HOPPER_BUILT
  return true;
#else
  return false;
#endif
}

bool tma_rows_ok(const void* base, const RowStrides& s, int64_t batch, int64_t heads) {
  const auto ok = [](int64_t stride) { return stride > 0 && (stride * 2) % 16 == 0 && stride * 2 < (int64_t(1) << 40); };
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && ok(s.seq) && (batch <= 1 || ok(s.batch)) &&
         (heads <= 1 || ok(s.head));
}

std::string hopper_fwd_reject_reason(const AttentionProblem& p, int cc) {
  if (cc != 90) return "the Hopper kernel needs compute capability 9.0 (sm_90a code)";
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return "the Hopper kernel takes float16 or bfloat16 only";
  if (p.head_dim != 64 && p.head_dim != 128) return "the Hopper kernel takes head_dim 64 or 128 only";
  const cuda::MapRows maps = cuda::map_rows(p);  // the rows the tensor maps cover
  const int64_t tb = maps.batch, rows_q = maps.q, rows_k = maps.k;
  if (rows_q <= 0 || rows_k <= 0) return "the Hopper kernel needs at least one query and one key row";
  if (rows_q > INT32_MAX || rows_k > INT32_MAX) return "the Hopper kernel addresses rows with 32-bit coordinates";
  const int64_t rows = hopper_shape(p).block_rows;
  if (p.q_heads * p.batch * ((p.seq_q + rows - 1) / rows) > INT32_MAX) {
    return "the Hopper kernel's grid would exceed 2^31 - 1 blocks";
  }
  if (!tma_rows_ok(p.q, p.q_stride, tb, p.q_heads) || !tma_rows_ok(p.k, p.k_stride, tb, p.kv_heads) ||
      !tma_rows_ok(p.v, p.v_stride, tb, p.kv_heads)) {
    return "the Hopper kernel loads q, k, v with TMA: 16-byte aligned base and strides needed";
  }
  // The epilogue writes O's rows in 16-byte chunks where out's rows are 16-byte aligned, else in 4-byte words.
  const auto al4 = [](int64_t stride) { return (stride * 2) % 4 == 0; };
  if (reinterpret_cast<uintptr_t>(p.out) % 4 != 0 || !al4(p.out_stride.seq) || !al4(p.out_stride.head) ||
      !al4(p.out_stride.batch)) {
    return "the Hopper kernel stores out in 4-byte pairs: 4-byte aligned base and strides needed";
  }
  return {};
}

HopperShape hopper_shape(const AttentionProblem& p) {
  if (p.head_dim == 64) {
    return cuda_fwd::masked_rows(p.mask) && p.seq_q <= 4096 ? HopperShape{128, 2} : HopperShape{192, 1};
  }
  return {128, p.seq_k <= 2048 ? 1 : 2};
}

std::string hopper_fwd_kernel_name(const AttentionProblem& p, HopperShape shape) {
  return std::string("cuda_hopper_wgmma_") + (p.dtype == DType::f16 ? "f16" : "bf16") + "_d" +
         std::to_string(p.head_dim) + "_" + std::to_string(shape.block_rows) + "x" + std::to_string(kBlockKeys) +
         "_p" + std::to_string(shape.p_buffers) + "_pingpong";
}

int hopper_grid(const cuda_fwd::FwdParams& f, int ctas, int device) {
  const int64_t work_tiles = int64_t(f.q_tiles) * f.q_heads * f.batch;
  if (ctas <= 0) ctas = cuda::device_props(device).sms;
  return int(std::min<int64_t>(work_tiles, ctas));
}

bool hopper_dynamic_schedule(const AttentionProblem& p, const cuda_fwd::FwdParams& f, int grid) {
  return cuda_fwd::uneven_tiles(p.mask, p.varlen()) && grid < int64_t(f.q_tiles) * f.q_heads * f.batch;
}

}  // namespace flashlite::cuda_fwd_hopper
