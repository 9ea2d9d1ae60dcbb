#pragma once
// The engine's small CUDA kernels (everything but GEMMs and attention), host-callable. Element type of weights and
// activations is `Elem` (fp32 or bf16); the residual stream is always fp32 and every reduction accumulates in fp32.
// Streams are cudaStream_t passed as void* so this header needs no CUDA include.
#include <cstddef>
#include <cstdint>

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

struct RopeAppendParams {
  void* qkv = nullptr;            // (rows, (heads + 2 kv_heads) * head_dim) Elem: q and k rotated in place
  const float* cos = nullptr;     // (context, head_dim / 2)
  const float* sin = nullptr;     // (context, head_dim / 2)
  const int32_t* pos = nullptr;   // (rows) position of each row
  const int64_t* cache_row = nullptr;  // (rows) row of the KV cache that receives this row's k and v
  void* k_cache = nullptr;        // (cache rows, kv_heads, head_dim) Elem, this layer
  void* v_cache = nullptr;
  int rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool interleaved = false;       // llama2.c pairs (2i, 2i+1); else (i, i + D/2)
  Elem elem = Elem::bf16;
  bool pdl = true;                // launched as a programmatic dependent of the QKV projection where the device has it
};
// Rotates q and k (RoPE) and appends k and v to the cache, one launch.
void rope_append(const RopeAppendParams& p, void* stream);

// h[r, i] = silu(g[r, i]) * u[r, i] with g, u the halves of h13 (rows, 2 hidden) -> h (rows, hidden), Elem
void swiglu(void* h, const void* h13, int rows, int hidden, Elem e, void* stream);

// x[i] += float(y[i]) over n elements.  x fp32, y Elem
void residual_add(float* x, const void* y, size_t n, Elem e, void* stream);

// Host fp32 -> device Elem (through a staging buffer); dst must hold n elements.
void upload(void* dst, const float* src, size_t n, Elem e);

}  // namespace flashlite::engine::cuda_ops
