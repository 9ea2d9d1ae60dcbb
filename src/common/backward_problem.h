#pragma once
// The validated backward problem every backward kernel receives (built once by src/backward.cpp): the forward's
// problem (q, k, v, out, lse, options) plus dout and the gradient outputs.
#include <cstdint>

#include "common/problem.h"

namespace flashlite {

struct BackwardProblem {
  AttentionProblem fwd;  // fwd.out and fwd.lse are inputs here; fwd.lse is never null
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  RowStrides dout_stride, dq_stride, dk_stride, dv_stride;
  float* dsink = nullptr;  // [q_heads] when fwd.sink_logits is set
  const float* dlse = nullptr;  // optional, shaped like fwd.lse
  LseStrides dlse_stride;
  // The row term D_i = dout_i . out_i less dlse_i (when given) of tensor batch tb, q head h, tensor row r.
  float dlse_at(int64_t tb, int64_t h, int64_t r) const {
    return dlse ? dlse[tb * dlse_stride.batch + h * dlse_stride.head + r * dlse_stride.seq] : 0.f;
  }
  int64_t k_tensor_rows = 0;  // k.shape[1]: seq_k, or total keys for varlen
  bool deterministic = false;
};

}  // namespace flashlite
