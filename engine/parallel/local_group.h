#pragma once
// Tensor-parallel ranks as threads of one process, exchanging host memory: the CPU engine's --tp and the tests that
// check the sharding against the whole model. The sum adds the ranks' values in rank order, so every rank gets the
// same bits and a run is reproducible.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/parallel/collective.h"

namespace flashlite::engine {

class LocalGroup final : public CollectiveGroup {
 public:
  explicit LocalGroup(int ranks);
  ~LocalGroup() override;
  int ranks() const override { return int(members_.size()); }
  std::string name() const override { return "in-process sums"; }
  Collective& member(int r) override;
  void abort() override;
  bool recover() override;

 private:
  class Member;
  // Waits until every rank has arrived (a generation-counting barrier). Throws Error when the group is aborted.
  void arrive_and_wait();

  std::vector<std::unique_ptr<Member>> members_;
  std::vector<float*> buffers_;  // the arrays of the collective in flight, by rank
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  long generation_ = 0;
  bool aborted_ = false;
};

}  // namespace flashlite::engine
