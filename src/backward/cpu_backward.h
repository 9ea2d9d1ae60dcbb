#pragma once
// Shared pieces of the CPU backward (src/backward/cpu.cpp drives it; cpu_tiles.h holds the tile work, compiled once
// per instruction set).
#include <cstdint>
#include <vector>

#include "common/backward_problem.h"
#include "common/mask.h"

namespace flashlite::cpu_backward {

inline constexpr int64_t kTile = 64;  // query rows and keys per tile

// Per-row terms of the backward, one float per (tensor batch, q head, q tensor row): L (the forward's LSE) and
// D = dout . out, gathered once before the passes.
struct RowTerms {
  int64_t heads = 0, rows = 0;
  std::vector<float> lse_, delta_;
  int64_t index(int64_t tensor_batch, int64_t h, int64_t row) const { return (tensor_batch * heads + h) * rows + row; }
  // Row i0 of sequence b's q head h (contiguous from there on).
  const float* lse(const SequenceSlice& s, int64_t h, int64_t i0) const {
    return lse_.data() + index(s.batch_index, h, s.q_row0 + i0);
  }
  const float* delta(const SequenceSlice& s, int64_t h, int64_t i0) const {
    return delta_.data() + index(s.batch_index, h, s.q_row0 + i0);
  }
};

// One thread's tiles: q, dout (kTile x d); a, b (K and V rows, kTile x d) and their transposes kt, vt (d x kTile);
// s (P), dp (dP, then dS), kTile x kTile; acc1, acc2 (kTile x d accumulators).
struct Scratch {
  std::vector<float> q, dout, a, b, kt, vt, s, dp, acc1, acc2;
  void resize(int64_t d) {
    const size_t n = size_t(kTile * d);
    for (auto* v : {&q, &dout, &a, &b, &kt, &vt, &acc1, &acc2}) v->resize(n);
    s.resize(size_t(kTile * kTile));
    dp.resize(size_t(kTile * kTile));
  }
};

struct Kernels {
  const char* name;
  // dK, dV of key block kb of kv head kvh of sequence b.
  void (*dkdv)(const BackwardProblem&, const RowTerms&, int64_t b, int64_t kvh, int64_t kb, Scratch&);
  // dQ of q block qb of q head h of sequence b; returns the block's share of dsink (0 without sink logits).
  double (*dq)(const BackwardProblem&, const RowTerms&, int64_t b, int64_t h, int64_t qb, Scratch&);
};

extern const Kernels kPortable;
#if defined(__x86_64__)
extern const Kernels kAvx2;
extern const Kernels kAvx512;
#endif

}  // namespace flashlite::cpu_backward
