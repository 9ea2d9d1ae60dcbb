#include "engine/parallel/rank_threads.h"

#include <sched.h>

namespace flashlite::engine {

namespace {

// Spins while `busy()` holds, for at most `limit` (the caller then blocks on its condition variable).
template <typename Busy>
void spin_while(Busy busy, std::chrono::microseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (int i = 0;; ++i) {
    if (!busy()) return;
    if ((i & 255) == 255 && std::chrono::steady_clock::now() > end) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

// The cores this process may run on (its affinity mask; a container's CPU quota is not seen).
unsigned usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return unsigned(CPU_COUNT(&set));
  return std::thread::hardware_concurrency();
}

}  // namespace

// Spinning needs a core per spinning thread (the caller and every rank) and one to spare; with fewer, spinners
// would take the cores that the thread with work to do is waiting for.
RankThreads::RankThreads(int ranks, bool spin) : errors_(ranks), spin_(spin && usable_cores() >= unsigned(ranks) + 2) {
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
  if (spin_) {  // (a step's length; past it, the waits below with their deadline)
    lock.unlock();
    const std::chrono::microseconds limit =
        deadline.count() > 0 ? std::min<std::chrono::microseconds>(kCallerSpin, deadline) : kCallerSpin;
    spin_while([&] { return pending_.load() != 0; }, limit);
    lock.lock();
  }
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
    if (spin_) spin_while([&] { return job_.load() == seen; }, kRankSpin);  // the next step comes soon
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
