#pragma once
// One long-lived thread per tensor-parallel rank: a CUDA rank's device, stream and graphs, and a CPU rank's OpenMP
// team, stay with the thread that made them. run(fn) calls fn(rank) on every rank's thread and waits for all.
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
  explicit RankThreads(int ranks);
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

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  const std::function<void(int)>* on_error_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  long job_ = 0;  // incremented per run()
  int pending_ = 0;
  bool stop_ = false;
  bool timed_out_ = false;
};

}  // namespace flashlite::engine
