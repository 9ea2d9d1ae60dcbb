#include "engine/parallel/local_group.h"

#include <string>

#include "engine/errors.h"

namespace flashlite::engine {

class LocalGroup::Member final : public Collective {
 public:
  Member(LocalGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int ranks() const override { return g_.ranks(); }

  void all_reduce_sum(void* data, size_t n, DType dtype, void*) override {
    if (dtype != DType::f32) fail("the in-process all-reduce sums fp32 host arrays; got " + std::string(dtype_name(dtype)));
    float* mine = static_cast<float*>(data);
    g_.buffers_[rank_] = mine;
    g_.arrive_and_wait();  // every rank's array is published
    // Rank r sums the r-th stretch over all ranks and writes it back to every rank: no two ranks touch one element.
    const int R = ranks();
    const size_t begin = n * rank_ / R, end = n * (rank_ + 1) / R;
    for (size_t i = begin; i < end; ++i) {
      float sum = g_.buffers_[0][i];
      for (int r = 1; r < R; ++r) sum += g_.buffers_[r][i];
      for (int r = 0; r < R; ++r) g_.buffers_[r][i] = sum;
    }
    g_.arrive_and_wait();  // every stretch is written before any rank reads its array again
  }

 private:
  LocalGroup& g_;
  int rank_;
};

LocalGroup::LocalGroup(int ranks) {
  if (ranks < 1) fail("a group of " + std::to_string(ranks) + " ranks; expected at least 1");
  buffers_.assign(ranks, nullptr);
  for (int r = 0; r < ranks; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

LocalGroup::~LocalGroup() = default;

Collective& LocalGroup::member(int r) { return *members_.at(r); }

void LocalGroup::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

bool LocalGroup::recover() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  waiting_ = 0;
  return true;
}

void LocalGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) throw CollectiveAborted();
  const long gen = generation_;
  if (++waiting_ == ranks()) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) throw CollectiveAborted();
}

}  // namespace flashlite::engine
