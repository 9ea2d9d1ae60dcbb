#pragma once
// The validated, resolved attention problem every backend receives. Built once by src/dispatch.cpp.
#include <cstdint>

#include "common/mask.h"
#include "common/strides.h"
#include "flashlite/tensor.h"

namespace flashlite {


// K/V of one paged KV-cache sequence read in place by the CPU tiled kernel (src/cpu/kv_prefill.cpp sets it on a
// batch-1 problem): key j is row j % page_size of page page_ids[j / page_size], i.e. element
// page * page_stride + (j % page_size) * stride.seq + head * stride.head of k (v).
struct KvPagesView {
  const int32_t* page_ids = nullptr;  // host memory, the sequence's pages in order
  int64_t page_size = 0;
  int64_t k_page_stride = 0, v_page_stride = 0;
};

struct AttentionProblem {
  DType dtype = DType::f32;
  Device device{};
  int64_t batch = 0;     // number of sequences (varlen: cu_seqlens length - 1)
  int64_t seq_q = 0;     // padded: seq_q of every sequence; varlen: max over sequences
  int64_t seq_k = 0;     // padded: seq_k of every sequence; varlen: max over sequences
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t q_tensor_rows = 0;  // q.shape[1]: seq_q, or total rows for varlen

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  RowStrides q_stride, k_stride, v_stride, out_stride;

  float* lse = nullptr;  // optional, fp32
  LseStrides lse_stride;

  const float* sink_logits = nullptr;  // optional, [q_heads], same device as q
  double scale = 1.0;
  double softcap = 0.0;
  MaskParams mask;

  // Varlen (both set or both null; host memory). Sequence b has rows cu_seqlens[b] .. cu_seqlens[b+1]-1 of
  // the single "batch" of the tensors; its lengths are the differences.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;

  // CPU tiled kernel only, batch 1, padded: K/V through a page table instead of k_stride.seq alone (null: dense).
  const KvPagesView* kv_pages = nullptr;

  bool varlen() const { return cu_seqlens_q != nullptr; }
  int64_t group_size() const { return q_heads / kv_heads; }
  int64_t kv_head_of(int64_t q_head) const { return q_head / group_size(); }
};

// One sequence of the problem: row offsets into the tensors and its lengths. Works for padded and varlen.
struct SequenceSlice {
  int64_t q_row0, k_row0;  // first row (seq index) in the tensor
  int64_t batch_index;     // batch index in the tensor (0 for varlen)
  int64_t seq_q, seq_k;
};

inline SequenceSlice sequence_slice(const AttentionProblem& p, int64_t b) {
  if (p.varlen()) {
    return {p.cu_seqlens_q[b], p.cu_seqlens_k[b], 0, int64_t(p.cu_seqlens_q[b + 1]) - p.cu_seqlens_q[b],
            int64_t(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b]};
  }
  return {0, 0, b, p.seq_q, p.seq_k};
}

// Converts one stored element to float (fp16/bf16/fp32), host side.
float load_as_float(const void* base, DType dtype, int64_t index);
void store_from_float(void* base, DType dtype, int64_t index, float value);

}  // namespace flashlite
