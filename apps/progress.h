#pragma once
// A one-line progress report on stderr for steps that may take long ("checking ...: 37%, 12 s"). Shown only when
// stderr is a terminal and the step has run for `delay_s`, so quick runs and piped output stay clean; a ticker thread
// redraws it, and the line is erased when the step ends.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace flashlite::cli {

class Progress {
 public:
  explicit Progress(std::string what, double delay_s = 2.0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // Fraction done, 0 to 1 (from the working thread); until the first call only the elapsed time is shown.
  void set(double fraction) { fraction_.store(fraction, std::memory_order_relaxed); }

 private:
  void tick();
  std::string what_;
  double delay_s_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<double> fraction_{-1.0};
  bool shown_ = false;  // touched by the ticker thread only, read after join
  std::mutex mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread ticker_;
};

}  // namespace flashlite::cli
