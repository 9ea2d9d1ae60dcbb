#pragma once
// The fused GEMVs (gemv.h) at the five call sites of a decode step, and how each is launched. Every choice is the one
// measured fastest on the H100 (docs/history/perf-notes.md, Engine (CUDA), rounds 3, 12 and 13), made from the model's shape
// and the step's rows alone:
//   QKV       RMSNorm prologue; RoPE + KV-cache append fused into its epilogue where head_dim % 8 == 0 (else a bf16
//             store, then flashlite::append_kv);
//   O, down   residual-adding epilogue, split-K by gemv_auto_split (2 warps per row for Llama-3.2-1B's down); under
//             tensor parallelism the epilogue that sums over the ranks itself (sum_f32);
//   gate/up   RMSNorm prologue, SwiGLU epilogue; a block per tile in one-row steps (tiles are handed to the SMs as
//             blocks finish: 918-924 against 885-909 tok/s at batch 1), one resident wave otherwise;
//   LM head   RMSNorm prologue over the logit rows; the greedy argmax folded into its epilogue when asked for (no
//             memset and argmax launches); a block per tile in one-row steps (+0.5%), one resident wave otherwise.
#include <cstdint>

#include "engine/config.h"
#include "engine/cuda_ops/gemv.h"

namespace flashlite::engine::cuda_ops {

// Whether a step of `rows` rows of this model (bf16 weights) fits the GEMVs: every reduction length they see (dim,
// q_dim, hidden_dim) within their limits, the RMSNorm ones (k = dim) staging their rows in shared memory.
bool gemv_takes(const ModelConfig& c, int rows);
// Whether the QKV GEMV applies RoPE and appends to the KV cache itself (head_dim % 8 == 0).
bool gemv_fuses_rope(const ModelConfig& c);

// One step's GEMVs: the model's shape, the fp32 residual stream x (rows, dim) they read and add to, the step's rows.
struct StepGemvs {
  const ModelConfig& c;
  float* x;
  int rows;
  bool pdl;  // CudaEngineOptions::pdl
  void* stream;
  float* sum_into = nullptr;  // where O and down add (rows, dim) fp32; null (or `sum`): x
  const PeerSum* sum = nullptr;  // tensor parallelism: O and down sum over the ranks themselves and add to x (gemv.h)

  // qkv = rmsnorm(x) Wqkv^T into qkv (rows, q_dim + 2 kv_dim) bf16; with `rope` (gemv_fuses_rope) only q lands
  // there, rotated, and k (rotated) and v go to the KV cache.
  void qkv(const void* w, const void* norm, void* qkv, const GemvRope* rope) const;
  // x (or sum_into) += att Wo^T, att (rows, q_dim) bf16; with `sum`, x += the sum over the ranks of att Wo^T
  void o(const void* w, const void* att) const;
  void gate_up(const void* w, const void* norm, void* h) const;     // h = swiglu(rmsnorm(x) W13^T), (rows, hidden)
  void down(const void* w, const void* h) const;                    // x += h W2^T
  // logits (lrows, vocab) fp32 = rmsnorm(x[row_index]) W^T; with argmax_keys each row's argmax key folded in
  // (zeroed beforehand: ops.h's embed).
  void lm_head(const void* w, const void* norm, const int32_t* row_index, int lrows, float* logits,
               uint64_t* argmax_keys) const;
};

}  // namespace flashlite::engine::cuda_ops
