#include "engine/parallel/one_shot.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "engine/cuda_ops/device_buffer.h"
#include "engine/cuda_ops/pdl.cuh"
#include "engine/errors.h"
#include "engine/parallel/collective.h"  // CollectiveAborted
#include "engine/parallel/peer_sum.cuh"

namespace flashlite::engine {

namespace {

using cuda_ops::cuda_check;
using cuda_ops::pdl_launch_dependents;
using cuda_ops::pdl_wait;

using peer_sum::Wait;
constexpr int kThreads = OneShotSum::kThreads;

struct OneShotParams {
  PeerSum q;  // the inboxes, rounds and stop words (fused_target's)
  int n4;     // float4 vectors of the sum
  float* x;
  float* partial;
};

// Waits until `line` holds round `flag` in both words; false when the wait was given up (a peer that never came
// within the timeout, or the group aborted: the step fails, its sums do not matter).
__device__ __forceinline__ bool await_line(const void* line, unsigned flag, uint4& v, Wait& w, const PeerSum& q) {
  for (;;) {
    v = peer_sum::load_line(line);
    if (v.y == flag && v.w == flag) return true;
    if (!w.go_on(q.error, q.abort, q.gave_up)) return false;
  }
}

// Thread i owns float4 vector i of the sum (elements 4i .. 4i + 3, whose round counters always agree: every sum's
// size is a multiple of 4). It pushes its partial to each peer's inbox as LL lines tagged with the elements' round,
// reads the peers' lines from its own inbox (local memory), adds the sum over ranks in rank order (the same bits on
// every rank) to x, and zeroes its partial for the next GEMV that accumulates into it. The rounds and inbox halves
// are those of the fused GEMV sum (peer_sum.h), so the two may follow each other.
__global__ void __launch_bounds__(kThreads) one_shot_sum_kernel(const __grid_constant__ OneShotParams p) {
  pdl_launch_dependents();  // the next GEMV may start loading its weights; it waits for this grid's end to read x
  pdl_wait();               // the partial sums (the previous GEMV) and the previous round (the previous sum)
  const int i = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (i >= p.n4) return;
  const PeerSum& q = p.q;
  uint4* counters = reinterpret_cast<uint4*>(q.round) + i;
  const unsigned round = counters->x + 1;
  *counters = make_uint4(round, round, round, round);
  float4* part = reinterpret_cast<float4*>(p.partial) + i;
  const float4 own = *part;
  *part = make_float4(0.f, 0.f, 0.f, 0.f);
  const size_t to = peer_sum::word_at(q, round, q.rank, 4 * size_t(i));  // elements 4i .. 4i + 3: two lines
  for (int r = 0; r < q.ranks; ++r) {
    if (r == q.rank) continue;
    uint2* at = static_cast<uint2*>(q.inbox[r]) + to;
    peer_sum::store_line(at, own.x, own.y, round);
    peer_sum::store_line(at + 2, own.z, own.w, round);
  }
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  Wait wait;
  bool ok = true;
  for (int r = 0; r < q.ranks; ++r) {  // rank order: the same bits on every rank
    float4 v = own;
    if (r != q.rank && ok) {
      const uint2* from = static_cast<const uint2*>(q.inbox[q.rank]) + peer_sum::word_at(q, round, r, 4 * size_t(i));
      uint4 a{}, b{};
      ok = await_line(from, round, a, wait, q) && await_line(from + 2, round, b, wait, q);
      v = make_float4(__uint_as_float(a.x), __uint_as_float(a.z), __uint_as_float(b.x), __uint_as_float(b.z));
    }
    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
  }
  float4* xi = reinterpret_cast<float4*>(p.x) + i;
  float4 r = *xi;
  r.x += sum.x, r.y += sum.y, r.z += sum.z, r.w += sum.w;
  *xi = r;
}

}  // namespace

std::unique_ptr<OneShotSum> OneShotSum::create(const std::vector<int>& devices, bool pdl) {
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
  g->pdl_ = pdl;
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
    // The halves start with flags that their rounds never carry, even after the counters wrap: half 0 (even rounds)
    // all ones, half 1 (odd rounds) zeros.
    const size_t half_bytes = kInboxLines * sizeof(uint4);
    // The counters and, after them, the gave-up word: zeros.
    const size_t counter_bytes = (kMaxFloats + 4) * sizeof(unsigned);
    made = made && ok(cudaMalloc(&k.inbox, 2 * half_bytes)) && ok(cudaMalloc(&k.round, counter_bytes)) &&
           ok(cudaMemset(k.inbox, 0xff, half_bytes)) &&
           ok(cudaMemset(static_cast<char*>(k.inbox) + half_bytes, 0, half_bytes)) &&
           ok(cudaMemset(k.round, 0, counter_bytes)) &&
           ok(cudaHostAlloc(&k.error, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    if (made) {
      *k.error = 0;
      made = ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&k.error_dev), k.error, 0)) &&
             ok(cudaDeviceSynchronize());  // the zeroed inbox is in place before any peer writes into it
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
    if (k.inbox) cudaFree(k.inbox);
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

PeerSum OneShotSum::fused_target(int rank) const {
  PeerSum q;
  q.rank = rank;
  q.ranks = int(ranks_.size());
  for (int r = 0; r < q.ranks; ++r) q.inbox[r] = ranks_[r].inbox;
  q.round = ranks_[rank].round;
  q.half_words = 2 * kInboxLines;  // an LL line is two {value, flag} words
  q.rank_words = kMaxFloats;       // a rank's region: kMaxFloats / 2 lines
  q.error = ranks_[rank].error_dev;
  q.abort = abort_;  // portable mapped memory: the host address is the device address on every GPU (UVA)
  q.gave_up = ranks_[rank].gave_up();
  return q;
}

void OneShotSum::sum_into(int rank, float* x, float* partial, size_t n, void* stream) {
  if (!takes(x, partial, n)) {
    fail("one-shot all-reduce of " + std::to_string(n) + " floats; at most " + std::to_string(kMaxFloats) +
         ", a multiple of 4, 16-byte aligned arrays");
  }
  OneShotParams p{};
  p.q = fused_target(rank);
  p.n4 = int(n / 4);
  p.x = x;
  p.partial = partial;
  const int blocks = (p.n4 + kThreads - 1) / kThreads;
  if (blocks == 0) return;  // nothing to sum (every rank agrees: the same n)
  cuda_check(cuda_ops::launch_pdl(pdl_, one_shot_sum_kernel, dim3(blocks), dim3(kThreads), 0,
                                  cudaStream_t(stream), p),
             "one-shot all-reduce launch");
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
