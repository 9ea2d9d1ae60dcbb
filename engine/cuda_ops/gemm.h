#pragma once
// y = x W^T on the GPU through cuBLASLt: x (rows, in) and W (out, in) row-major in Elem (bf16 or fp32), fp32
// accumulation (no TF32, so fp32 runs are exact to fp32 rounding), y (rows, out) in Elem or fp32 (logits).
// Plans (descriptors + chosen algorithm) are cached per shape; row counts past 16 take their row bucket's
// algorithm where it fits them (gemm.cpp: algo_rows).
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "engine/cuda_ops/ops.h"

namespace flashlite::engine::cuda_ops {

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  void run(void* y, const void* x, const void* w, int rows, int in, int out, Elem e, bool y_f32, void* stream);
  // The row counts in [from, max_rows] whose first run searches cuBLASLt's algorithms for every later row count it
  // stands for: each count up to 16, then one per bucket (max_rows itself for the bucket it ends in). A server runs
  // these once before its first request.
  static std::vector<int> search_rows(int from, int max_rows);

 private:
  struct Plan;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashlite::engine::cuda_ops
