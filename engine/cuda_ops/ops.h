#pragma once
// The engine's small CUDA kernels (everything but GEMMs, the KV append and attention: the library's), host-callable. Element type of weights and
// activations is `Elem` (fp32 or bf16); the residual stream is always fp32 and every reduction accumulates in fp32.
// Streams are cudaStream_t passed as void* so this header needs no CUDA include.
#include <cstddef>
#include <cstdint>

#include "flashlite/kv_cache.h"

namespace flashlite::engine::cuda_ops {

enum class Elem { f32, bf16 };
size_t elem_size(Elem e);

// x[r, :] = float(table[tokens[r], :]).    x: (rows, dim) fp32; table: (vocab, dim) Elem
// zero_keys: optional (n_keys) uint64 zeroed on the way (the argmax keys that the LM-head GEMV's fused argmax
// folds into at the end of the same step: one memset node fewer).
void embed(float* x, const void* table, const int32_t* tokens, int rows, int dim, Elem e, void* stream,
           uint64_t* zero_keys = nullptr, int n_keys = 0);

// Blocks the stream until *flag becomes nonzero (host-written pinned memory) or about `timeout_ms` pass: --profile
// queues a whole step behind it so the GPU runs the step without host gaps (step_profile.h).
void wait_flag(const volatile int* flag, int timeout_ms, void* stream);

// out[r, :] = x[src, :] * rsqrt(mean(x[src, :]^2) + eps) * w, src = row_index ? row_index[r] : r.
// x: fp32 (any rows, dim); w: (dim) Elem; out: (rows, dim) Elem
void rmsnorm(void* out, const float* x, const void* w, const int32_t* row_index, int rows, int dim, float eps, Elem e,
             void* stream);

// The fused QKV epilogue's RoPE tables (gemv.h's GemvRope): cos / sin (positions, head_dim / 2) fp32 =
// flashlite::cuda::rope_cos_sin(p, rope_frequency(rope, head_dim, c)), the values the library's append kernel
// computes per token. Synchronous (once per model).
void rope_tables(float* cos, float* sin, const RopeOptions& rope, int positions, int head_dim);

// h[r, i] = silu(g[r, i]) * u[r, i] with g, u the halves of h13 (rows, 2 hidden) -> h (rows, hidden), Elem
void swiglu(void* h, const void* h13, int rows, int hidden, Elem e, void* stream);

// x[i] += float(y[i]) over n elements.  x fp32, y Elem
void residual_add(float* x, const void* y, size_t n, Elem e, void* stream);

// Host fp32 -> device Elem (through a staging buffer); dst must hold n elements.
void upload(void* dst, const float* src, size_t n, Elem e);

}  // namespace flashlite::engine::cuda_ops
