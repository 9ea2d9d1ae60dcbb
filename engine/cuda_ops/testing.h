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
// y holds (rows, out) and is read first where the epilogue accumulates. `launches` back-to-back launches (the
// accumulating epilogue adds that many times; each a programmatic dependent of the one before where the device has
// PDL). own_stream: on a stream created for the call (non-blocking) instead of the legacy default one.
void gemv(const GemvParams& shape, const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& xf,
          const std::vector<float>& norm_w, const std::vector<int32_t>& row_index, std::vector<float>& y,
          int launches = 1, bool own_stream = false);

// One Gemm (one plan cache, so the algorithm choices carry over from call to call as in the engine) run once per row
// count of `rows_list`, in order: y = x W^T with x the first rows of `x` ((max rows, in)) and W (out, in), in bf16
// (the inputs rounded on the way up) or fp32, fp32 out. Returns each call's y (rows, out).
std::vector<std::vector<float>> gemm_sequence(const std::vector<int>& rows_list, int in, int out, bool bf16,
                                              const std::vector<float>& w, const std::vector<float>& x);

// Median microseconds of `iters` launches of gemv at these sizes on random data (no check; for the record).
double gemv_time_us(const GemvParams& shape, int iters);
// Microseconds per launch of `iters` launches queued back to back between two events (median of 5 such streams).
double gemv_back_to_back_time_us(const GemvParams& shape, int iters);

// The QKV GEMV with RoPE + KV-cache append, fused (one gemv with the rope_bf16 epilogue, its cos / sin from ops.h's
// rope_tables) or unfused (the bf16 epilogue, then flashlite::append_kv: the library's RoPE and cache), on the same
// inputs, into one flashlite KV cache [rows, positions, kv_heads, head_dim] bf16 in which activation row r is
// sequence r and its token sits at position pos[r] (the sequence holds pos[r] + 1 tokens; the engine's cache rows
// r * positions + pos[r]). shape: sizes, eps and shape.rope's heads / kv_heads / head_dim / interleaved (its
// pointers are ignored); RoPE theta `theta`. y comes back (rows, out): the fused form defines only the q columns,
// the unfused one has q rotated in place; the caches (rows * positions, kv_heads * head_dim) start as NaN
// everywhere, so rows nobody wrote come back NaN.
void gemv_rope(const GemvParams& shape, bool fused, const std::vector<float>& w, const std::vector<float>& xf,
               const std::vector<float>& norm_w, double theta, int positions, const std::vector<int32_t>& pos,
               std::vector<float>& y, std::vector<float>& k_cache, std::vector<float>& v_cache);

// The LM-head GEMV with the argmax epilogue: the keys start as all ones, the embedding kernel zeroes them (as the
// engine does), then the gemv writes y (rows, out) fp32 and folds the argmax; returns each row's argmax index.
std::vector<int32_t> gemv_argmax(const GemvParams& shape, const std::vector<float>& w, const std::vector<float>& xf,
                                 const std::vector<float>& norm_w, const std::vector<int32_t>& row_index,
                                 std::vector<float>& y, std::vector<uint64_t>* keys = nullptr);

std::vector<int32_t> argmax_rows(const std::vector<float>& logits, int rows, int vocab);
std::vector<uint64_t> argmax_keys(const std::vector<float>& logits, int rows, int vocab);  // the keys themselves
void top_k_rows(const std::vector<float>& logits, int rows, int vocab, int k, std::vector<float>& values,
                std::vector<int32_t>& ids);

}  // namespace flashlite::engine::cuda_ops::testing
