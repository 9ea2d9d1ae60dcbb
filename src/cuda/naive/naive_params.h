#pragma once
// Parameters of the split ("naive") CUDA kernels, filled once per call by naive.cu and passed by value.
#include <cstdint>

#include "common/mask.h"
#include "common/strides.h"

namespace flashlite::cuda_naive {

struct NaiveParams {
  const void* q = nullptr;  // (batch, seq_q, q_heads, head_dim), head_dim contiguous
  const void* k = nullptr;  // (batch, seq_k, kv_heads, head_dim)
  const void* v = nullptr;  // (batch, seq_k, kv_heads, head_dim)
  void* out = nullptr;      // (batch, seq_q, q_heads, head_dim), q's dtype
  float* lse = nullptr;     // optional (batch, q_heads, seq_q); varlen (1, q_heads, total_q)
  const float* sink_logits = nullptr;  // optional (q_heads)
  float* s = nullptr;       // workspace (batch * q_heads, seq_q, seq_k) fp32: scores, then P in place

  RowStrides q_stride, k_stride, v_stride, out_stride;
  LseStrides lse_stride;

  int64_t batch = 0;  // sequences
  int64_t seq_q = 0;  // padded: every sequence; varlen: the longest (rows of each S matrix)
  int64_t seq_k = 0;  // likewise (columns, the row stride of S)
  int64_t q_heads = 0;
  int64_t group = 1;  // q_heads / kv_heads: kv_head = q_head / group
  int64_t head_dim = 0;

  float scale = 1.f;
  float softcap = 0.f;  // 0 = off
  MaskParams mask;

  // Varlen: device copies of cu_seqlens_q / cu_seqlens_k (batch + 1 each, in the workspace); null when padded.
  const int* cu_q = nullptr;
  const int* cu_k = nullptr;

  FL_HD int64_t pairs() const { return batch * q_heads; }
};

// One sequence: where its rows start in the tensors and its lengths.
struct SeqView {
  int64_t tb;      // tensor batch index (0 for varlen)
  int64_t q_row0;  // first q/out row in the tensor
  int64_t k_row0;  // first k/v row
  int64_t sq, sk;
};

#if defined(__CUDACC__)
__device__ __forceinline__ SeqView seq_view(const NaiveParams& p, int64_t b) {
  if (p.cu_q == nullptr) return {b, 0, 0, p.seq_q, p.seq_k};
  return {0, p.cu_q[b], p.cu_k[b], int64_t(p.cu_q[b + 1]) - p.cu_q[b], int64_t(p.cu_k[b + 1]) - p.cu_k[b]};
}
#endif

// Launchers, one per step (instantiated for float, __half, __nv_bfloat16 where the step reads q/k/v).
template <class T>
void launch_scores(const NaiveParams& p, void* stream);  // S = Q K^T          (gemm_nt.cu)
void launch_scale_mask(const NaiveParams& p, void* stream);  // scale, softcap, mask (softmax.cu)
void launch_softmax(const NaiveParams& p, void* stream);     // P = softmax(S), LSE  (softmax.cu)
template <class T>
void launch_pv(const NaiveParams& p, void* stream);      // O = P V            (gemm_nn.cu)

inline constexpr int kKernelsPerCall = 4;  // kernel launches of one call (plus one H2D copy for varlen)

}  // namespace flashlite::cuda_naive
