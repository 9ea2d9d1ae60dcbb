#pragma once
// The one collective tensor parallelism needs inside a forward pass: the sum of every rank's partial output of a
// row-parallel projection (O and down), in place. Implementations: LocalGroup (ranks as threads of one process,
// host memory: the CPU engine and the sharding tests) and NcclGroup (one GPU per rank, device memory, NCCL).
#include <cstddef>
#include <functional>
#include <string>

#include "engine/parallel/peer_sum.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"

namespace flashlite::engine {

// What a rank throws when it was released from a collective because another rank failed (that rank's own error is
// the one to report).
struct CollectiveAborted : Error {
  CollectiveAborted() : Error(ErrorKind::runtime, "another tensor-parallel rank failed; this rank's step was abandoned") {}
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // data[0, n) of every rank := the sum over ranks, the same values on every rank. `stream`: the CUDA stream the
  // data is ordered on (device implementations; the call only queues the work), ignored on the host. Throws Error
  // when the group was aborted (another rank failed) or the collective failed.
  virtual void all_reduce_sum(void* data, size_t n, DType dtype, void* stream) = 0;
  // x[0, n) += the sum over ranks of partial[0, n) (fp32), then partial[0, n) = 0, in one fused step where the
  // implementation has one for this size (returns true); false: nothing was done, the caller all-reduces and adds
  // itself.
  virtual bool sum_into(float* /*x*/, float* /*partial*/, size_t /*n*/, void* /*stream*/) { return false; }
  // Whether the GEMV that makes this rank's partial of x[0, n) may sum it over the ranks and add it to x itself
  // (fills `sum`: peer_sum.h), with no partial array and no collective call after it; the same answer on every rank.
  virtual bool fused_sum(const float* /*x*/, size_t /*n*/, PeerSum* /*sum*/) { return false; }
  // After the rank's step synchronized: throws Error when a collective of the step failed on the device.
  virtual void check() {}
  // Runs `launch`, which queues device work holding this group's collectives (a CUDA graph of a step), unless the
  // group was aborted (throws CollectiveAborted); abort() waits until it has queued, so no graph replays over an
  // aborted communicator.
  virtual void guarded(const std::function<void()>& launch) { launch(); }
};

// The ranks of one model, each a Collective.
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int ranks() const = 0;
  virtual std::string name() const = 0;  // how it communicates, e.g. "NCCL + one-shot over NVLink"
  virtual Collective& member(int rank) = 0;  // used from rank `rank`'s thread only
  // A rank failed: release every rank waiting in a collective (they throw Error). Called from any thread.
  virtual void abort() = 0;
  // After an abort, once every rank has returned: whether the group can be used again (the in-process one can; a
  // NCCL communicator, once aborted, cannot).
  virtual bool recover() = 0;
};

}  // namespace flashlite::engine
