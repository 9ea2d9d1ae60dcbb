#pragma once
// Shared by the Python bridges (module.cpp and kv.cpp: arrays through DLPack and nanobind; torch_ops.cpp: the torch
// ops), with no nanobind or torch in it: the mask options as Python passes them, the refusals of an array's dtype,
// device and rank (one wording, whichever bridge saw the array), and when a call's scratch memory may be left to the
// backend's own allocation.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "flashlite/attention.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"

#if FLASHLITE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlite::py {

// The scale and mask arguments every attention entry point takes from Python (tensor options are set by the caller).
inline AttentionOptions mask_options(bool causal, std::optional<double> scale, int window_left, int window_right,
                                     int sink_tokens, double softcap) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale;
  o.window_left = window_left;
  o.window_right = window_right;
  o.sink_tokens = sink_tokens;
  o.softcap = softcap;
  return o;
}

// An array of a dtype flashlite does not take (dtype as DLPack names it: float64, int64, bool, ...).
inline Error dtype_error(const char* name, const std::string& dtype) {
  return Error(ErrorKind::invalid_type, std::string(name) + " has dtype " + dtype +
                                           "; expected float32, float16 or bfloat16 (int32 for cu_seqlens)");
}

// An array in memory other than the CPU's or a CUDA device's (`where` as its library names the device).
inline Error device_error(const char* name, const std::string& where) {
  return Error(ErrorKind::invalid_value, std::string(name) + " is on " + where + "; expected CPU or CUDA memory");
}

inline void check_rank(int64_t rank, const char* name) {
  if (rank > kMaxRank) {
    throw Error(ErrorKind::invalid_value, std::string(name) + " has rank " + std::to_string(rank) +
                                              "; expected at most " + std::to_string(kMaxRank));
  }
}

// Whether a scratch of `bytes` for a call on `stream` can be left to the backend's own stream-ordered allocation: a
// few bytes (the Hopper kernel's tile counter) outside a CUDA graph capture. That costs no host time beside a torch
// allocation through Python (4 us a call on the H100 machine); under capture the caller's allocator serves, so that
// the graph holds no memory node.
inline bool backend_allocates(size_t bytes, Device dev, void* stream) {
#if FLASHLITE_WITH_CUDA
  constexpr size_t kSmallScratch = 4096;
  if (bytes > kSmallScratch || dev.type != DeviceType::cuda) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the launch's error check to report; the caller's allocation serves
    return false;
  }
  return status == cudaStreamCaptureStatusNone;
#else
  (void)bytes, (void)dev, (void)stream;
  return false;
#endif
}

}  // namespace flashlite::py
