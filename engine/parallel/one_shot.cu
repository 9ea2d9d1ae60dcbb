#include "engine/parallel/one_shot.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "engine/cuda_ops/device_buffer.h"
#include "engine/errors.h"
#include "engine/parallel/collective.h"  // CollectiveAborted

namespace flashlite::engine {

namespace {

using cuda_ops::cuda_check;

// About 20 s: far past any step (first launches load modules; a peer's host may be capturing a graph), short of the
// host's own step deadline. The group's abort word is read every millisecond of waiting (it lives in host memory).
constexpr unsigned long long kTimeoutNs = 20'000'000'000ULL;
constexpr unsigned long long kAbortPollNs = 1'000'000ULL;
constexpr int kThreads = 1024;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct OneShotParams {
  int rank, ranks;
  size_t n;
  float* x;
  const float* partial;
  float* staging[OneShotSum::kMaxRanks];    // every rank's staging buffer (peer memory but this rank's own)
  unsigned* flags[OneShotSum::kMaxRanks];   // every rank's flags
  unsigned* round;
  int* error;
  int* abort;  // the group's abort word (mapped host memory)
};

// One block: the messages are a few rows of the residual stream, so the latency of the flags is what counts.
__global__ void __launch_bounds__(kThreads) one_shot_sum_kernel(OneShotParams p) {
  __shared__ unsigned round;
  if (threadIdx.x == 0) round = *p.round + 1;  // only this rank's kernels touch it, in stream order
  __syncthreads();
  // Two staging halves: a peer can run at most one round ahead (it needs this rank's flag of the next round, which
  // this rank writes only after it has read this round), so it never overwrites the half being read.
  const size_t half = size_t(round & 1u) * OneShotSum::kMaxFloats;
  // float4 throughout (sum_into takes n % 4 == 0 and 16-byte aligned arrays; the staging halves are): at most
  // kMaxFloats / 4 / kThreads = 4 vectors per thread, their peer loads issued together below.
  constexpr int kPer = int(OneShotSum::kMaxFloats / 4 / kThreads);
  const int n4 = int(p.n / 4);
  float4* mine = reinterpret_cast<float4*>(p.staging[p.rank] + half);
  const float4* part = reinterpret_cast<const float4*>(p.partial);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    if (i < n4) mine[i] = part[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the block's staging writes (ordered before by the barrier) reach the peers first
    for (int q = 0; q < p.ranks; ++q)
      if (q != p.rank) *reinterpret_cast<volatile unsigned*>(p.flags[q] + p.rank) = round;
    const unsigned long long t0 = global_ns();
    unsigned long long poll = t0 + kAbortPollNs;
    volatile int* abort_word = p.abort;
    bool stop = *abort_word != 0;  // an aborted group: no waiting (the step is failed anyway)
    const volatile unsigned* mine_flags = p.flags[p.rank];
    for (int q = 0; q < p.ranks && !stop; ++q) {
      if (q == p.rank) continue;
      while (int(mine_flags[q] - round) < 0) {  // (wraps like the counters)
        const unsigned long long now = global_ns();
        if (now - t0 > kTimeoutNs) {  // a peer never came: this rank reports it, every rank stops waiting
          *reinterpret_cast<volatile int*>(p.error) = 1;
          *abort_word = 1;
          stop = true;
          break;
        }
        if (now > poll) {
          poll = now + kAbortPollNs;
          if (*abort_word) {
            stop = true;
            break;
          }
        }
      }
    }
    __threadfence_system();  // the peers' staging reads below come after their flags
    *p.round = round;
  }
  __syncthreads();
  float4 sum[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) sum[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = 0; q < p.ranks; ++q) {  // rank order: the same bits on every rank
    const float4* peer = reinterpret_cast<const float4*>(p.staging[q] + half);
    float4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = int(threadIdx.x) + k * kThreads;
      v[k] = i < n4 ? __ldcv(peer + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      sum[k].x += v[k].x, sum[k].y += v[k].y, sum[k].z += v[k].z, sum[k].w += v[k].w;
    }
  }
  float4* x = reinterpret_cast<float4*>(p.x);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * kThreads;
    if (i < n4) {
      float4 r = x[i];
      r.x += sum[k].x, r.y += sum[k].y, r.z += sum[k].z, r.w += sum[k].w;
      x[i] = r;
    }
  }
}

}  // namespace

std::unique_ptr<OneShotSum> OneShotSum::create(const std::vector<int>& devices) {
  const int R = int(devices.size());
  if (R < 2 || R > kMaxRanks) return nullptr;
  for (int a : devices) {
    for (int b : devices) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
        cudaGetLastError();
        return nullptr;
      }
    }
  }
  std::unique_ptr<OneShotSum> g(new OneShotSum());
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // Any failure below (a refused peer mapping, no memory): what was made is freed (the destructor), the current
  // device restored, and NCCL does everything.
  const auto ok = [](cudaError_t e) {
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  };
  g->ranks_.resize(R);
  bool made = ok(cudaHostAlloc(&g->abort_, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  if (made) *reinterpret_cast<volatile int*>(g->abort_) = 0;
  for (int r = 0; r < R && made; ++r) {
    Rank& k = g->ranks_[r];
    k.device = devices[r];
    made = ok(cudaSetDevice(k.device));
    for (int peer : devices) {
      if (!made || peer == k.device) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      made = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;  // (already enabled: by NCCL)
      cudaGetLastError();
    }
    made = made && ok(cudaMalloc(&k.staging, 2 * kMaxFloats * sizeof(float))) &&
           ok(cudaMalloc(&k.flags, kMaxRanks * sizeof(unsigned))) && ok(cudaMalloc(&k.round, sizeof(unsigned))) &&
           ok(cudaMemset(k.flags, 0, kMaxRanks * sizeof(unsigned))) && ok(cudaMemset(k.round, 0, sizeof(unsigned))) &&
           ok(cudaHostAlloc(&k.error, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    if (made) {
      *k.error = 0;
      made = ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&k.error_dev), k.error, 0)) &&
             ok(cudaDeviceSynchronize());  // the zeroed flags are in place before any peer writes into them
    }
  }
  cudaSetDevice(current);
  cudaGetLastError();
  if (!made) return nullptr;  // ~OneShotSum frees the partial setup
  return g;
}

OneShotSum::~OneShotSum() {
  int current = 0;
  cudaGetDevice(&current);
  for (Rank& k : ranks_) {
    cudaSetDevice(k.device);
    if (k.staging) cudaFree(k.staging);
    if (k.flags) cudaFree(k.flags);
    if (k.round) cudaFree(k.round);
    if (k.error) cudaFreeHost(k.error);
  }
  if (abort_) cudaFreeHost(abort_);
  cudaSetDevice(current);
  cudaGetLastError();
}

bool OneShotSum::takes(const float* x, const float* partial, size_t n) {
  return n <= kMaxFloats && n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(partial) % 16 == 0;
}

void OneShotSum::sum_into(int rank, float* x, const float* partial, size_t n, void* stream) {
  if (!takes(x, partial, n)) {
    fail("one-shot all-reduce of " + std::to_string(n) + " floats; at most " + std::to_string(kMaxFloats) +
         ", a multiple of 4, 16-byte aligned arrays");
  }
  OneShotParams p{};
  p.rank = rank;
  p.ranks = int(ranks_.size());
  p.n = n;
  p.x = x;
  p.partial = partial;
  for (int q = 0; q < p.ranks; ++q) {
    p.staging[q] = ranks_[q].staging;
    p.flags[q] = ranks_[q].flags;
  }
  p.round = ranks_[rank].round;
  p.error = ranks_[rank].error_dev;
  p.abort = abort_;  // portable mapped memory: the host address is the device address on every GPU (UVA)
  one_shot_sum_kernel<<<1, kThreads, 0, cudaStream_t(stream)>>>(p);
  cuda_check(cudaGetLastError(), "one-shot all-reduce launch");
}

void OneShotSum::check(int rank) {
  if (*reinterpret_cast<volatile int*>(ranks_[rank].error)) {
    fail_runtime("tensor-parallel rank " + std::to_string(rank) +
                 ": a peer never joined a one-shot all-reduce (about 20 s); the ranks are out of step");
  }
  if (*reinterpret_cast<volatile int*>(abort_)) throw CollectiveAborted();
}

void OneShotSum::abort() { *reinterpret_cast<volatile int*>(abort_) = 1; }

}  // namespace flashlite::engine
