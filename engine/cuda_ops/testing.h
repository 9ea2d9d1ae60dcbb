#pragma once
// Host round trips through the engine's CUDA kernels, for tests/engine/cuda_ops_test.cpp (which needs no CUDA
// headers): host data is uploaded, the kernel runs on a fresh stream, results come back. Each call throws Error when
// no CUDA device is present.
#include <cstdint>
#include <vector>

#include "engine/cuda_ops/gemv.h"

namespace flashlite::engine::cuda_ops::testing {

bool device_available();

// Runs gemv with `shape`'s sizes, modes and eps (its pointers are ignored). w, x, norm_w are rounded to bf16 on the
// way up (pass values already representable to compare exactly); xf is fp32 (stream rows as row_index needs);
// y holds (rows, out) and is read first where the epilogue accumulates.
void gemv(const GemvParams& shape, const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& xf,
          const std::vector<float>& norm_w, const std::vector<int32_t>& row_index, std::vector<float>& y);

// Median microseconds of `iters` launches of gemv at these sizes on random data (no check; for the record).
double gemv_time_us(const GemvParams& shape, int iters);

std::vector<int32_t> argmax_rows(const std::vector<float>& logits, int rows, int vocab);
void top_k_rows(const std::vector<float>& logits, int rows, int vocab, int k, std::vector<float>& values,
                std::vector<int32_t>& ids);

}  // namespace flashlite::engine::cuda_ops::testing
