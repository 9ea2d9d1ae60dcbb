#pragma once
// Prefill from a KV cache (include/flashlite/kv_cache.h, prefill()): the validated problem every backend receives and
// the backends' entry points. CPU: src/cpu/kv_prefill.cpp (the tiled forward kernel per sequence); CUDA:
// src/cuda/fwd/launch.cu (the fused tensor-core kernel with its KV-cache loader, contiguous or paged).
#include <cstdint>
#include <string>

#include "backends.h"
#include "common/problem.h"
#include "kv/kv_problem.h"

namespace flashlite {

struct PrefillProblem {
  KvCacheDesc cache;  // validated (lengths, page ids, shapes)
  // q / out / lse / options of the whole batch as forward() would see them: padded q [batch, seq_q, ...] or ragged
  // q [1, total_q, ...] with attn.cu_seqlens_q (host); k / v are the cache's base pointers with its strides (batch
  // stride = page stride when paged); seq_q = the longest chunk, seq_k = the longest sequence; cu_seqlens_k stays
  // null (the cache gives the key lengths).
  AttentionProblem attn;

  bool ragged() const { return attn.cu_seqlens_q != nullptr; }
  // Query rows of sequence b (its chunk: the last chunk(b) tokens of the sequence) and its first row in q.
  int64_t chunk(int64_t b) const {
    return ragged() ? int64_t(attn.cu_seqlens_q[b + 1]) - attn.cu_seqlens_q[b] : attn.seq_q;
  }
  int64_t q_row0(int64_t b) const { return ragged() ? attn.cu_seqlens_q[b] : 0; }
};

// src/kv/kv_prefill_validate.cpp: every argument checked on the host (throws Error, nothing written).
PrefillProblem validate_prefill(const PrefillArgs& args);
// A validated decode problem as the padded prefill problem it is (q_len rows per sequence; a sequence may hold fewer
// than q_len tokens, or none: its leading rows see no key). The CPU decode runs through it.
PrefillProblem prefill_from_decode(const DecodeProblem& dp);

// src/cpu/kv_prefill.cpp
void cpu_prefill(const PrefillProblem& p);

#if FLASHLITE_WITH_CUDA
// src/cuda/fwd/launch.cu: the fused kernel's KV-cache variant, as planned by plan_cuda_fused(p.attn, ..., &p.cache).
void run_cuda_prefill(const PrefillProblem& p, const FwdPlan& plan, void* stream);
std::string cuda_prefill_kernel_name(const PrefillProblem& p, const FwdPlan& plan);
#endif

}  // namespace flashlite
