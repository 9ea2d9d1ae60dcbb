#pragma once
// One long-lived thread per tensor-parallel rank: a CUDA rank's device, stream and graphs, and a CPU rank's OpenMP
// team, stay with the thread that made them. run(fn) calls fn(rank) on every rank's thread and waits for all.
// With `spin` (GPU ranks, whose threads mostly wait on their streams), the hand-offs spin before they block: the
// caller for up to kCallerSpin while the ranks run, a rank for up to kRankSpin for the next job. Waking a blocked
// thread costs tens of microseconds, twice per decode step, against a 3 ms step at TP 2 on an 8B model; CPU ranks
// (which need the cores for their OpenMP teams) block at once, and so does everyone where the process may run on
// fewer cores (its affinity mask) than the spinning threads and one more.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashlite::engine {

class RankThreads {
 public:
  explicit RankThreads(int ranks, bool spin = false);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // fn(r) on rank r's thread, for every rank at once; returns when all are done, with what each threw (null: none).
  // `on_error(r)` is called on rank r's thread as soon as fn(r) throws (before the others finish): the place to
  // abort a collective that the other ranks may be waiting in. With a `deadline` (> 0), `on_timeout()` is called on
  // the caller's thread once the ranks have not all finished by then (the place to abort a collective that a rank
  // never reached); run then goes on waiting for them, and `timed_out()` says it happened.
  std::vector<std::exception_ptr> run(const std::function<void(int)>& fn,
                                      const std::function<void(int)>& on_error = {},
                                      std::chrono::milliseconds deadline = std::chrono::milliseconds(0),
                                      const std::function<void()>& on_timeout = {});
  bool timed_out() const { return timed_out_; }
  int ranks() const { return int(threads_.size()); }

 private:
  void loop(int rank);
  static constexpr std::chrono::microseconds kCallerSpin{20'000}, kRankSpin{2'000};

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  const std::function<void(int)>* on_error_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  std::atomic<long> job_{0};    // incremented per run() (under mu_, so that a blocked rank's wait sees it)
  std::atomic<int> pending_{0};  // ranks still running this job (decremented under mu_)
  const bool spin_;
  bool stop_ = false;
  bool timed_out_ = false;
};

}  // namespace flashlite::engine
