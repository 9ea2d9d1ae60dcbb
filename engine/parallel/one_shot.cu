#include "engine/parallel/one_shot.h"

#include <cuda_runtime.h>

#include <string>

#include "engine/cuda_ops/device_buffer.h"
#include "engine/errors.h"

namespace flashlite::engine {

namespace {

using cuda_ops::cuda_check;

// About 20 s at the H100's clock: far past any step (first launches load modules; a peer's host may be capturing a
// graph), short of the host's own step deadline.
constexpr long long kTimeoutCycles = 40'000'000'000LL;
constexpr int kThreads = 1024;

struct OneShotParams {
  int rank, ranks;
  size_t n;
  float* x;
  const float* partial;
  float* staging[OneShotSum::kMaxRanks];    // every rank's staging buffer (peer memory but this rank's own)
  unsigned* flags[OneShotSum::kMaxRanks];   // every rank's flags
  unsigned* round;
  int* error;
};

// One block: the messages are a few rows of the residual stream, so the latency of the flags is what counts.
__global__ void __launch_bounds__(kThreads) one_shot_sum_kernel(OneShotParams p) {
  __shared__ unsigned round;
  if (threadIdx.x == 0) round = *p.round + 1;  // only this rank's kernels touch it, in stream order
  __syncthreads();
  // Two staging halves: a peer can run at most one round ahead (it needs this rank's flag of the next round, which
  // this rank writes only after it has read this round), so it never overwrites the half being read.
  const size_t half = size_t(round & 1u) * OneShotSum::kMaxFloats;
  float* mine = p.staging[p.rank] + half;
  for (size_t i = threadIdx.x; i < p.n; i += kThreads) mine[i] = p.partial[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the block's staging writes (ordered before by the barrier) reach the peers first
    for (int q = 0; q < p.ranks; ++q)
      if (q != p.rank) *reinterpret_cast<volatile unsigned*>(p.flags[q] + p.rank) = round;
    const long long t0 = clock64();
    const volatile unsigned* mine_flags = p.flags[p.rank];
    for (int q = 0; q < p.ranks; ++q) {
      if (q == p.rank) continue;
      while (int(mine_flags[q] - round) < 0) {  // (wraps like the counters)
        if (clock64() - t0 > kTimeoutCycles) {
          *reinterpret_cast<volatile int*>(p.error) = 1;
          break;
        }
      }
    }
    __threadfence_system();  // the peers' staging reads below come after their flags
    *p.round = round;
  }
  __syncthreads();
  for (size_t i = threadIdx.x; i < p.n; i += kThreads) {
    float s = 0.f;
    for (int q = 0; q < p.ranks; ++q) s += __ldcv(p.staging[q] + half + i);  // rank order: the same bits everywhere
    p.x[i] += s;
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
  cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  g->ranks_.resize(R);
  for (int r = 0; r < R; ++r) {
    Rank& k = g->ranks_[r];
    k.device = devices[r];
    cuda_check(cudaSetDevice(k.device), "cudaSetDevice");
    for (int peer : devices) {
      if (peer == k.device) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) cuda_check(e, "peer access");
      cudaGetLastError();  // (already enabled: by NCCL)
    }
    cuda_check(cudaMalloc(&k.staging, 2 * kMaxFloats * sizeof(float)), "one-shot staging");
    cuda_check(cudaMalloc(&k.flags, kMaxRanks * sizeof(unsigned)), "one-shot flags");
    cuda_check(cudaMalloc(&k.round, sizeof(unsigned)), "one-shot round");
    cuda_check(cudaMemset(k.flags, 0, kMaxRanks * sizeof(unsigned)), "one-shot flags");
    cuda_check(cudaMemset(k.round, 0, sizeof(unsigned)), "one-shot round");
    cuda_check(cudaHostAlloc(&k.error, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable), "one-shot error flag");
    *k.error = 0;
    cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&k.error_dev), k.error, 0), "one-shot error flag");
  }
  cuda_check(cudaSetDevice(current), "cudaSetDevice");
  return g;
}

OneShotSum::~OneShotSum() {
  int current = 0;
  cudaGetDevice(&current);
  for (Rank& k : ranks_) {
    cudaSetDevice(k.device);
    cudaFree(k.staging);
    cudaFree(k.flags);
    cudaFree(k.round);
    cudaFreeHost(k.error);
  }
  cudaSetDevice(current);
}

void OneShotSum::sum_into(int rank, float* x, const float* partial, size_t n, void* stream) {
  if (n > kMaxFloats) fail("one-shot all-reduce of " + std::to_string(n) + " floats; at most " + std::to_string(kMaxFloats));
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
  one_shot_sum_kernel<<<1, kThreads, 0, cudaStream_t(stream)>>>(p);
  cuda_check(cudaGetLastError(), "one-shot all-reduce launch");
}

void OneShotSum::check(int rank) {
  if (*reinterpret_cast<volatile int*>(ranks_[rank].error)) {
    fail_runtime("tensor-parallel rank " + std::to_string(rank) +
                 ": a peer never joined a one-shot all-reduce (about 20 s); the ranks are out of step");
  }
}

}  // namespace flashlite::engine
