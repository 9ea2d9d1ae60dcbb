#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/cuda_ops/select.h"
#include "engine/cuda_ops/select_keys.cuh"
#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

namespace {

__device__ __forceinline__ uint64_t key_of(float v, int i) { return argmax_key(v, i); }

constexpr int kArgmaxThreads = 256, kArgmaxPerThread = 16;

// grid (chunks, rows): each block reduces kArgmaxThreads * kArgmaxPerThread elements of one row, then one 64-bit
// atomicMax per block into keys[row] (zeroed first; 0 is below every key of a NaN-free row).
__global__ void argmax_kernel(uint64_t* keys, const float* logits, int vocab) {
  const int row = blockIdx.y;
  const float* x = logits + size_t(row) * vocab;
  const int begin = blockIdx.x * kArgmaxThreads * kArgmaxPerThread;
  const int end = min(vocab, begin + kArgmaxThreads * kArgmaxPerThread);
  uint64_t best = 0;
  for (int i = begin + threadIdx.x; i < end; i += kArgmaxThreads) best = max(best, key_of(x[i], i));
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  __shared__ uint64_t part[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) best = max(best, part[w]);
    atomicMax(reinterpret_cast<unsigned long long*>(keys + row), (unsigned long long)best);
  }
}

constexpr int kTopKThreads = 1024;

// One block per row. Radix select, 8 bits a pass from the top, on the unique 64-bit keys: after a pass, the keys
// whose decided top bits exceed the prefix are all in the top k, those below are out, and the bucket equal to the
// prefix is refined in the next pass. Stops once the whole bucket fits (usually after the 4 value passes; the index
// passes run only for ties at the k-th value), then writes every key whose top bits are >= the prefix: exactly k.
__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(float* values, int32_t* ids, const float* logits, int vocab,
                                                             int k) {
  const int row = blockIdx.x, lane = threadIdx.x & 31;
  const float* x = logits + size_t(row) * vocab;
  __shared__ int hist[256];
  __shared__ int chosen_digit, chosen_need, done, count;
  uint64_t prefix = 0, mask = 0;
  int need = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kTopKThreads) hist[d] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kTopKThreads) {
      const uint64_t key = key_of(x[i], i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns digits [8l, 8l + 8); counts above its range come from the lanes above it.
      int own = 0;
      for (int j = 0; j < 8; ++j) own += hist[lane * 8 + j];
      int above = 0;  // sum over the lanes above this one (larger digits)
      for (int l = 31; l > 0; --l) {
        const int v = __shfl_sync(0xffffffffu, own, l);
        if (l > lane) above += v;
      }
      if (above < need && need <= above + own) {
        int cum = above;
        for (int d = lane * 8 + 7; d >= lane * 8; --d) {
          if (cum + hist[d] >= need) {
            chosen_digit = d;
            chosen_need = need - cum;  // still to take from bucket d
            done = hist[d] == need - cum;
            break;
          }
          cum += hist[d];
        }
      }
    }
    __syncthreads();
    prefix |= uint64_t(chosen_digit) << shift;
    mask |= uint64_t(255) << shift;
    need = chosen_need;
    const bool finished = done;
    __syncthreads();
    if (finished) break;
  }
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kTopKThreads) {
    const float v = x[i];
    if ((key_of(v, i) & mask) >= prefix) {
      const int slot = atomicAdd(&count, 1);
      if (slot < k) {
        values[size_t(row) * k + slot] = v;
        ids[size_t(row) * k + slot] = i;
      }
    }
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of ") + what + " failed: " + cudaGetErrorString(e));
}

}  // namespace

void argmax_rows(uint64_t* keys, const float* logits, int rows, int vocab, void* stream) {
  if (rows == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cudaMemsetAsync(keys, 0, size_t(rows) * 8, s) != cudaSuccess) fail_runtime("CUDA memset of the argmax keys failed");
  const int per_block = kArgmaxThreads * kArgmaxPerThread;
  argmax_kernel<<<dim3((vocab + per_block - 1) / per_block, rows), kArgmaxThreads, 0, s>>>(keys, logits, vocab);
  check_launch("argmax");
}

void top_k_rows(float* values, int32_t* ids, const float* logits, int rows, int vocab, int k, void* stream) {
  if (k <= 0 || k >= vocab) fail("top-k with k = " + std::to_string(k) + "; expected 0 < k < " + std::to_string(vocab));
  if (rows == 0) return;
  top_k_kernel<<<rows, kTopKThreads, 0, static_cast<cudaStream_t>(stream)>>>(values, ids, logits, vocab, k);
  check_launch("top_k");
}

}  // namespace flashlite::engine::cuda_ops
