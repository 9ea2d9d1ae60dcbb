#pragma once
// Per-call host arrays (varlen offsets past the inline table) on their way to the device: a stream-ordered
// allocation that is freed stream-ordered when the call ends, also when a launch throws, and a refusal under CUDA
// graph capture (the copy reads pageable host memory that is gone after the call, so a replay could not repeat it).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/check.h"
#include "flashlite/errors.h"

namespace flashlite::cuda {

// Throws a clear error when `stream` is being captured into a CUDA graph; `what` names the call's host array.
inline void refuse_host_copy_under_capture(cudaStream_t stream, const std::string& what) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (st != cudaStreamCaptureStatusNone) {
    throw Error(ErrorKind::invalid_value,
                what + " are copied from host memory on every call, which a CUDA graph cannot capture; call it "
                       "outside the capture, or with at most 128 sequences (offsets passed in the kernel arguments)");
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

// varlen_table copied to `dst` (device memory for 2 * (batch + 1) int32) on `stream`; refused under graph capture,
// `what` naming the offsets. From pageable memory: returns once the bytes are staged. Returns dst as the device
// cu_seqlens_q; cu_seqlens_k follows batch + 1 entries later.
inline const int* copy_varlen_table(void* dst, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t batch,
                                    cudaStream_t stream, const std::string& what) {
  refuse_host_copy_under_capture(stream, what);
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
    if (need > 0) FL_CUDA_CHECK(cudaMallocAsync(&owned.ptr, need, owned.stream));
    return static_cast<char*>(owned.ptr);
  }
  if (workspace_bytes < need) {
    throw Error(ErrorKind::invalid_value, "workspace has " + std::to_string(workspace_bytes) + " bytes; " + who +
                                              " needs " + std::to_string(need) + " for these shapes (see " + sizer +
                                              ")");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw Error(ErrorKind::invalid_value, "workspace is not 16-byte aligned; expected an allocation's start address");
  }
  return static_cast<char*>(workspace);
}

}  // namespace flashlite::cuda
