#pragma once
// The KV cache API: cache views (contiguous or paged), append of new K/V with rotary embedding, decode
// (attention of a few new query tokens over the whole cache) with a plan/run split, and prefill (a chunk of any
// length per sequence over the whole cache, through the fused forward kernel).
//
// Layouts (element views, any strides for the first three dimensions, head_dim contiguous):
//   contiguous  k, v [batch, max_len, kv_heads, head_dim]; sequence b holds host.seq_lens[b] tokens at rows 0...
//   paged       k, v [num_pages, page_size, kv_heads, head_dim], page_size 16..256 (FlashInfer's CSR page table):
//               sequence b owns the pages page_indices[page_indptr[b] .. page_indptr[b+1]) in token order (they need
//               not be contiguous or ordered in the pool); its last page holds last_page_len[b] tokens, so it holds
//               (pages - 1) * page_size + last_page_len[b] tokens (0 when it has no pages).
//
// Lengths describe the cache AFTER the step's append: grow seq_lens / the page table first, then append_kv()
// writes the new tokens as the last n of each sequence, then decode() attends over the whole sequence.
//
// Index arrays are int32, contiguous, and given twice for CUDA caches: `host` (CPU memory, read by validation and
// planning before anything is launched) and `device` (the same values on the cache's device, read by the kernels,
// so that a CUDA graph captured once reads the current lengths at every replay). Keeping both in sync is the
// caller's job; CPU caches fill only `host`.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashlite/attention.h"
#include "flashlite/tensor.h"

namespace flashlite {

enum class KvLayout { contiguous, paged };

struct KvIndex {
  TensorView seq_lens;       // contiguous: int32 [batch], 0..max_len
  TensorView page_indptr;    // paged: int32 [batch + 1], non-decreasing
  TensorView page_indices;   // paged: int32 [>= page_indptr[batch]], page ids in [0, num_pages)
  TensorView last_page_len;  // paged: int32 [batch], 1..page_size (0 only for a sequence without pages)
};

struct KvCacheView {
  KvLayout layout = KvLayout::contiguous;
  TensorView k, v;  // same shape and dtype (float16 / bfloat16; float32 on the CPU)
  KvIndex host;     // CPU memory
  KvIndex device;   // CUDA caches: the same arrays on the cache's device
};

// Tokens sequence b holds, read from the host index (validates nothing; for callers and tests).
int64_t kv_length(const KvCacheView& cache, int64_t b);

// ------------------------------------------------------------------------------------------------ rotary embedding

enum class RopeLayout {
  half_split,   // pairs (c, c + head_dim/2): Hugging Face Llama / GPT-NeoX
  interleaved,  // pairs (2c, 2c + 1): Meta's original Llama / GPT-J
};

// Token at cache position p (0-based within its sequence) rotates pair c by the angle p * inv_freq(c), with
// inv_freq(c) = theta^(-2c / head_dim), optionally rescaled by Llama-3's 'llama3' rule (rope_scaling.rope_type
// "llama3" in Hugging Face configs): wavelengths longer than original_max_position / low_freq_factor are divided
// by factor, shorter than original_max_position / high_freq_factor kept, and smoothly interpolated between; then
// divided by linear_factor ("linear" rope_type: position interpolation). (x, y) -> (x cos - y sin, y cos + x sin).
// Angles are computed in float64 on every backend. The rule, the pairs and the rotation: flashlite/rope.h (host and
// device); the device's cos / sin: flashlite/cuda/rope.cuh.
struct RopeOptions {
  bool enabled = false;
  double theta = 10000.0;
  RopeLayout layout = RopeLayout::half_split;
  bool llama3 = false;
  double llama3_factor = 8.0;
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  double llama3_original_max_position = 8192.0;
  double linear_factor = 1.0;  // every inv_freq divided by it (1: none)
};

// inv_freq(c) of the rule above, 0 <= c < head_dim / 2.
double rope_inv_freq(const RopeOptions& rope, int64_t head_dim, int64_t c);

// ------------------------------------------------------------------------------------------------ append

struct AppendArgs {
  KvCacheView cache;
  TensorView k, v;    // new tokens [batch, n, kv_heads, head_dim], the cache's dtype; they become positions
                      // length(b) - n .. length(b) - 1 of sequence b
  TensorView q;       // optional [batch, n, q_heads, head_dim]: rotated with the same positions (needs rope.enabled)
  TensorView q_out;   // required with q: where the rotated q goes; may be q itself (in place), else must not overlap
  RopeOptions rope;   // applied to k (and q) on the way; v is copied as is
  Backend backend = Backend::automatic;  // automatic, cpu or cuda
  void* stream = nullptr;                // cudaStream_t for CUDA caches
};

// Validates everything first (shapes, dtypes, devices, lengths vs max_len or the pages given, page ids, pages
// written by two sequences): on error throws flashlite::Error and writes nothing. One kernel launch on CUDA.
void append_kv(const AppendArgs& args);

// ------------------------------------------------------------------------------------------------ decode

// A decode plan: computed on the host from shapes and a length bound only (no device sync), so a decode step
// can be captured in a CUDA graph and replayed while the lengths (read by the kernels from cache.device) grow.
// How a split decode's partials merge on CUDA: in a thread-block cluster (sm_90, splits that fit one cluster, no
// partials in global memory) or by the combine kernel (any device, any split count).
enum class DecodeMerge { automatic, cluster, combine };

// Tests and benchmarks force the plan's choices here; the default choice needs none.
struct DecodeOverrides {
  int num_splits = 0;                          // 0: chosen from batch, kv heads, the bound and the SM count; > 0 forces it
  DecodeMerge merge = DecodeMerge::automatic;  // cluster: an error where it cannot run (pre-sm_90, too many splits)
};

struct DecodePlan {
  int num_splits = 1;          // KV splits per (sequence, kv head): flash-decoding; their partials merge by LSE
  bool cluster_merge = false;  // CUDA: the splits merge in a cluster, else (num_splits > 1) in the combine kernel
  int64_t max_kv_len = 0;      // the longest sequence this plan serves
  int64_t batch = 0, q_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  Device device{};
  size_t workspace_bytes = 0;  // device scratch decode() needs with this plan (0 when num_splits == 1)
  std::string unsupported;     // non-empty: no decode kernel (or not the forced choice) can run these arguments, and why
  bool supported() const { return unsupported.empty(); }
};

struct DecodeArgs {
  TensorView q;    // [batch, q_len, q_heads, head_dim]: the last q_len tokens of each sequence (q_len 1..64 on CUDA)
  KvCacheView cache;
  TensorView out;  // like q
  TensorView lse;  // optional fp32 [batch, q_heads, q_len]
  // scale, causal (bottom-right: query i sits at position length - q_len + i), window, sink tokens, sink logits and
  // softcap exactly as forward() (attention.h); cu_seqlens must be empty (the cache gives the lengths).
  AttentionOptions options;
  Backend backend = Backend::automatic;  // automatic, cpu or cuda
  void* stream = nullptr;
  const DecodePlan* plan = nullptr;  // null: planned here from the current host lengths
  void* workspace = nullptr;         // >= plan->workspace_bytes on the cache's device; null: allocated per call
  size_t workspace_bytes = 0;        // (cudaMallocAsync/cudaFreeAsync on the stream)
};

// THE decode choice: whether a kernel can run args (else the plan's `unsupported` says why; decode() would throw it),
// the split count and how the splits merge. max_kv_len: the bound the plan must serve (e.g. the cache capacity for a
// graph replayed over many steps); -1 = the longest sequence in args.cache now. Validates args like decode() (throws
// Error on a bad argument). A plan passed in DecodeArgs::plan is re-checked against the call.
DecodePlan plan_decode(const DecodeArgs& args, int64_t max_kv_len = -1, const DecodeOverrides& overrides = {});

// Validates everything (throws Error, writes nothing), then runs: CPU, or on CUDA one split-KV kernel (GQA heads of
// a KV head packed as rows of one tile: one pass over that head's K/V) whose splits merge in a cluster or, when
// split otherwise, in one combine kernel.
void decode(const DecodeArgs& args);

// Which kernel decode() runs (with args.plan: under that plan), e.g. "cuda_decode_split_bf16_d128_contiguous (splits
// 32, combine kernel)". Validates args; throws the reason when unsupported.
std::string decode_kernel_name(const DecodeArgs& args);

// ------------------------------------------------------------------------------------------------ prefill

// Prefill / chunked prefill from the cache: a chunk of new queries per sequence attends over the whole cached
// sequence, after append_kv() has written the chunk's K/V. Query i of a chunk of n tokens of sequence b sits at
// position length(b) - n + i (bottom-right causal, as decode). Any chunk length (decode() serves q_len <= 8 faster).
struct PrefillArgs {
  // [batch, q_len, q_heads, head_dim]: the last q_len tokens of every sequence (q_len <= every length); or ragged
  // [1, total_q, q_heads, head_dim] with options.cu_seqlens_q: sequence b's chunk is rows cu[b] .. cu[b+1] - 1
  // (0 ..= length(b) rows; the realistic chunked-prefill batch mixes long chunks and single decode tokens).
  TensorView q;
  KvCacheView cache;
  TensorView out;  // like q
  TensorView lse;  // optional fp32 [batch, q_heads, q_len]; ragged: [1, q_heads, total_q]
  // scale, causal, window, sink tokens, sink logits and softcap exactly as forward(); cu_seqlens_q optional (int32
  // [batch + 1], CPU memory), cu_seqlens_k must be empty (the cache gives the key lengths).
  AttentionOptions options;
  Backend backend = Backend::automatic;  // automatic, cpu or cuda
  void* stream = nullptr;
};

// Validates everything as decode() does (throws Error, writes nothing), then runs: on CUDA the fused tensor-core
// forward kernel with its K/V tile loader reading the cache (through the page table when paged; a tile may span
// pages), one launch (float16 / bfloat16, head_dim 64 or 128); on the CPU the tiled forward kernel per sequence
// (reading a paged sequence through its page table). Ragged batches of more than 128 sequences copy their
// offsets to the device per call (cudaMallocAsync on the stream); otherwise no allocation and no host sync.
void prefill(const PrefillArgs& args);

// Which kernel prefill() runs, e.g. "cuda_prefill_paged_bf16_d128_br128_bc64_w4_s2_f3". Validates args.
std::string prefill_kernel_name(const PrefillArgs& args);

}  // namespace flashlite
