#pragma once
// The small all-reduce of a tensor-parallel decode step over NVLink peer memory (the "one-shot" all-reduce that vLLM,
// SGLang and TensorRT-LLM use for small messages, where NCCL's latency dominates). OneShotSum owns each rank's inbox,
// round counters and the group's abort word, which the engine's O / down GEMVs use to do the sum themselves
// (fused_target, peer_sum.h). sum_into is the same sum as one kernel per rank after a GEMV that wrote a partial (what
// --profile times, and the all-reduce benchmark): each rank writes its partial straight into every peer's inbox in
// NCCL's LL format (each value beside the round's flag, so a value and the news that it arrived cross NVLink together,
// with no fence), reads the peers' values from its own inbox, adds the sum over ranks (in rank order, so that every rank
// gets the same bits) to its residual stream and zeroes the partial. Launched as a programmatic dependent (sm_90).
// Built with NCCL (engine/parallel/nccl_group.cpp owns one); NCCL stays the path for larger messages and where two
// GPUs lack peer access.
#include <cstddef>
#include <memory>
#include <vector>

#include "engine/parallel/peer_sum.h"

namespace flashlite::engine {

class OneShotSum {
 public:
  static constexpr size_t kMaxFloats = 16384;  // 64 KB: a decode step of up to 4 rows at hidden size 4096
  static constexpr int kMaxRanks = PeerSum::kMaxRanks;
  static constexpr int kThreads = 256;                              // a block sums 256 float4 vectors
  static constexpr size_t kInboxLines = kMaxRanks * kMaxFloats / 2;  // an inbox half: 2 floats a 16-byte line
  // One rank per device of `devices`; null when some pair of them lacks peer access, there are too many, or the
  // setup fails (peer access refused, no memory): then NCCL does everything. Leaves the current device as it was.
  // `pdl`: launch as programmatic dependents where the device has them (the engine's --no-pdl turns it off).
  static std::unique_ptr<OneShotSum> create(const std::vector<int>& devices, bool pdl = true);
  ~OneShotSum();
  OneShotSum(const OneShotSum&) = delete;
  OneShotSum& operator=(const OneShotSum&) = delete;

  // Whether sum_into takes these arrays: n <= kMaxFloats, n % 4 == 0, both 16-byte aligned (float4 accesses).
  static bool takes(const float* x, const float* partial, size_t n);
  // Queued on rank `rank`'s stream (its device current): x[0, n) += sum over ranks of their partial[0, n), then
  // partial[0, n) = 0; fp32 device arrays that takes() accepts. Every rank must make the same calls in the same order
  // (as for any collective).
  void sum_into(int rank, float* x, float* partial, size_t n, void* stream);
  // What rank `rank`'s GEMV needs to do the sum itself (peer_sum.h), on arrays that takes() accepts: the same
  // inboxes, rounds and abort word, so fused sums and sum_into may follow each other.
  PeerSum fused_target(int rank) const;
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
    void* inbox = nullptr;       // 2 round halves x kInboxLines LL lines (16 bytes), on the rank's device; rank q
                                 //   writes lines [q * kMaxFloats / 2, (q + 1) * kMaxFloats / 2) of each half
    unsigned* round = nullptr;   // kMaxFloats: this rank's round counter of each element (its kernels only), then
                                 //   the rank's gave-up word (peer_sum.h)
    int* error = nullptr;        // mapped pinned host memory: set by a kernel that gave up
    int* error_dev = nullptr;    // the same, as the kernels address it
    int* gave_up() const { return reinterpret_cast<int*>(round + kMaxFloats); }
  };
  std::vector<Rank> ranks_;
  bool pdl_ = true;
  int* abort_ = nullptr;  // mapped pinned host memory, one word for the group: set by abort() or a kernel that gave up
};

}  // namespace flashlite::engine
