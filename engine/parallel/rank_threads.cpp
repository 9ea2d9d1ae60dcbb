#include "engine/parallel/rank_threads.h"

namespace flashlite::engine {

RankThreads::RankThreads(int ranks) : errors_(ranks) {
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<std::exception_ptr> RankThreads::run(const std::function<void(int)>& fn,
                                                 const std::function<void(int)>& on_error,
                                                 std::chrono::milliseconds deadline,
                                                 const std::function<void()>& on_timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  on_error_ = on_error ? &on_error : nullptr;
  errors_.assign(threads_.size(), nullptr);
  pending_ = int(threads_.size());
  timed_out_ = false;
  ++job_;
  work_.notify_all();
  if (deadline.count() > 0 && !done_.wait_for(lock, deadline, [&] { return pending_ == 0; })) {
    timed_out_ = true;
    lock.unlock();  // the abort may need the ranks to make progress
    if (on_timeout) on_timeout();
    lock.lock();
  }
  done_.wait(lock, [&] { return pending_ == 0; });
  fn_ = on_error_ = nullptr;
  return errors_;
}

void RankThreads::loop(int rank) {
  long seen = 0;
  for (;;) {
    const std::function<void(int)>* fn;
    const std::function<void(int)>* on_error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stop_ || job_ != seen; });
      if (stop_) return;
      seen = job_;
      fn = fn_;
      on_error = on_error_;
    }
    std::exception_ptr error;
    try {
      (*fn)(rank);
    } catch (...) {
      error = std::current_exception();
      if (on_error) {
        try {
          (*on_error)(rank);
        } catch (...) {
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    errors_[rank] = error;
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace flashlite::engine
