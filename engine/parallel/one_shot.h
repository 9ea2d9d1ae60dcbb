#pragma once
// The small all-reduce of a tensor-parallel decode step in one kernel per rank over NVLink peer memory (the
// "one-shot" all-reduce that vLLM, SGLang and TensorRT-LLM use for small messages, where NCCL's latency dominates):
// each rank copies its partial sum into its own staging buffer, publishes the round's number into every peer's
// flags, waits for theirs, then adds the sum over ranks (in rank order, so that every rank gets the same bits) to its
// residual stream: the all-reduce and the residual add in one launch. Built with NCCL (engine/parallel/nccl_group.cpp
// owns one); NCCL stays the path for larger messages and where two GPUs lack peer access.
#include <cstddef>
#include <memory>
#include <vector>

namespace flashlite::engine {

class OneShotSum {
 public:
  static constexpr size_t kMaxFloats = 16384;  // 64 KB: a decode step of up to 4 rows at hidden size 4096
  static constexpr int kMaxRanks = 8;
  // One rank per device of `devices`; null when some pair of them lacks peer access, there are too many, or the
  // setup fails (peer access refused, no memory): then NCCL does everything. Leaves the current device as it was.
  static std::unique_ptr<OneShotSum> create(const std::vector<int>& devices);
  ~OneShotSum();
  OneShotSum(const OneShotSum&) = delete;
  OneShotSum& operator=(const OneShotSum&) = delete;

  // Whether sum_into takes these arrays: n <= kMaxFloats, n % 4 == 0, both 16-byte aligned (float4 accesses).
  static bool takes(const float* x, const float* partial, size_t n);
  // Queued on rank `rank`'s stream (its device current): x[0, n) += sum over ranks of their partial[0, n), fp32 device
  // arrays that takes() accepts. Every rank must make the same calls in the same order (as for any collective).
  void sum_into(int rank, float* x, const float* partial, size_t n, void* stream);
  // After rank `rank`'s stream synchronized: throws Error when one of its kernels gave up waiting for a peer (a peer
  // that never came within about 20 s) or the group was aborted; the round counters are then out of step and the
  // group must not be reused.
  void check(int rank);
  // From any thread: every rank's kernels, queued or spinning, stop waiting for their peers (within about a
  // millisecond) and the group is unusable from then on (check() throws). What a failing rank's group does first.
  void abort();

 private:
  OneShotSum() = default;
  struct Rank {
    int device = 0;
    float* staging = nullptr;    // 2 rounds x kMaxFloats, on the rank's device
    unsigned* flags = nullptr;   // kMaxRanks: flags[q] = the last round rank q published (written by q)
    unsigned* round = nullptr;   // this rank's round counter (its kernels only)
    int* error = nullptr;        // mapped pinned host memory: set by a kernel that gave up
    int* error_dev = nullptr;    // the same, as the kernels address it
  };
  std::vector<Rank> ranks_;
  int* abort_ = nullptr;  // mapped pinned host memory, one word for the group: set by abort() or a kernel that gave up
};

}  // namespace flashlite::engine
