#pragma once
// Per-call host arrays (varlen offsets past the inline table) on their way to the device: a stream-ordered
// allocation that is freed stream-ordered when the call ends, also when a launch throws, and a refusal under CUDA
// graph capture (the copy reads pageable host memory that is gone after the call, so a replay could not repeat it).
// And the host values every launcher copies from its problem into its kernel's parameters (passed by value).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.h"
#include "cuda/common/check.h"
#include "flashlite/errors.h"
#include "kv/kv_problem.h"

namespace flashlite::cuda {

// Throws a clear error when `stream` is being captured into a CUDA graph; `what` names the call's host array.
// inline_up_to_128: the call passes the offsets of at most 128 sequences in the kernel arguments (the forward and the
// paged prefill), which the message then suggests.
inline void refuse_host_copy_under_capture(cudaStream_t stream, const std::string& what,
                                           bool inline_up_to_128 = false) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (st != cudaStreamCaptureStatusNone) {
    throw Error(ErrorKind::invalid_value,
                what + " are copied from host memory on every call, which a CUDA graph cannot capture; call it "
                       "outside the capture" +
                    (inline_up_to_128 ? ", or with at most 128 sequences (offsets passed in the kernel arguments)"
                                      : ""));
  }
}

// The varlen offsets of `batch` sequences as the kernels read them: (2, batch + 1) int32, cu_seqlens_q then
// cu_seqlens_k.
inline std::vector<int32_t> varlen_table(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t batch) {
  std::vector<int32_t> host(size_t(2 * (batch + 1)));
  for (int64_t b = 0; b <= batch; ++b) {
    host[size_t(b)] = cu_seqlens_q[b];
    host[size_t(batch + 1 + b)] = cu_seqlens_k[b];
  }
  return host;
}

// varlen_table copied to `dst` (device memory for 2 * (batch + 1) int32) on `stream`. Callers refuse graph capture
// first (refuse_host_copy_under_capture), before they enqueue anything, so that a refused call leaves the capture
// empty. From pageable memory: returns once the bytes are staged. Returns dst as the device cu_seqlens_q;
// cu_seqlens_k follows batch + 1 entries later.
inline const int* copy_varlen_table(void* dst, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t batch,
                                    cudaStream_t stream) {
  const std::vector<int32_t> host = varlen_table(cu_seqlens_q, cu_seqlens_k, batch);
  FL_CUDA_CHECK(cudaMemcpyAsync(dst, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  return static_cast<const int*>(dst);
}

// A device buffer for one call, freed stream-ordered by the destructor unless free_now() already did.
struct CallBuffer {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  explicit CallBuffer(cudaStream_t s) : stream(s) {}
  CallBuffer(const CallBuffer&) = delete;
  CallBuffer& operator=(const CallBuffer&) = delete;
  // Frees now and reports the result (the success path checks it).
  cudaError_t free_now() {
    const cudaError_t e = ptr ? cudaFreeAsync(ptr, stream) : cudaSuccess;
    ptr = nullptr;
    return e;
  }
  ~CallBuffer() {
    if (ptr) (void)cudaFreeAsync(ptr, stream);
  }
};

// The call's workspace: the caller's, which must hold `need` bytes and be 16-byte aligned (`who` needs it, `sizer`
// tells its size), or, when the caller passed none, one allocated stream-ordered into `owned`.
inline char* call_workspace(CallBuffer& owned, void* workspace, size_t workspace_bytes, size_t need,
                            const std::string& who, const std::string& sizer) {
  if (workspace == nullptr) {
    if (need > 0) {
      if (const cudaError_t e = cudaMallocAsync(&owned.ptr, need, owned.stream); e != cudaSuccess) {
        cudaGetLastError();
        throw Error(ErrorKind::runtime, "cudaMallocAsync of " + std::to_string(need) + " bytes of workspace for " + who +
                                            " failed: " + cudaGetErrorString(e));
      }
    }
    return static_cast<char*>(owned.ptr);
  }
  if (workspace_bytes < need) {
    throw Error(ErrorKind::invalid_value, "workspace has " + std::to_string(workspace_bytes) + " bytes; " + who +
                                              " needs " + std::to_string(need) + " for these shapes (see " + sizer +
                                              ")");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw Error(ErrorKind::invalid_value, "workspace is not 16-byte aligned (" + who +
                                              "); expected an allocation's start address");
  }
  return static_cast<char*>(workspace);
}

// ------------------------------------------------------------------ kernel parameters
// The parameter structs name the fields they take from a problem alike (the attention tensors: FwdParams, BwdParams,
// NaiveParams; the cache index: FwdParams, DecodeParams, AppendParams), so each fill is written once.

// The attention tensors of the problem: data and strides.
template <class Params>
void set_attention_tensors(Params& x, const AttentionProblem& p) {
  x.q = p.q, x.k = p.k, x.v = p.v, x.out = p.out, x.lse = p.lse, x.sink_logits = p.sink_logits;
  x.q_stride = p.q_stride, x.k_stride = p.k_stride, x.v_stride = p.v_stride, x.out_stride = p.out_stride;
  x.lse_stride = p.lse_stride;
}

// Scores in log2 units (scale * log2(e)) and the softcap's factors (s -> softcap * tanh(s * scale / softcap)): the
// same floats for the forward and the backward, whose recomputed P must meet the forward's LSE.
template <class Params>
void set_score_scaling(Params& x, const AttentionProblem& p) {
  const double log2e = 1.4426950408889634;
  x.scale_log2 = float(p.scale * log2e);
  if (p.softcap > 0) {
    x.softcap_pre = float(p.scale / p.softcap);
    x.softcap_post = float(p.softcap * log2e);
  }
}

// The cache's index as the kernels read it: lengths (contiguous) or the page table (paged).
template <class Params>
void set_cache_index(Params& x, const KvCacheDesc& c) {
  x.paged = c.paged;
  x.page_size = c.paged ? int(c.capacity) : 0;
  x.seq_lens = c.k_seq_lens;
  x.indptr = c.k_indptr;
  x.indices = c.k_indices;
  x.last_page_len = c.k_last_page_len;
}

}  // namespace flashlite::cuda
