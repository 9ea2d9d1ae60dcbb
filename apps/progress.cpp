#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace flashlite::cli {

Progress::Progress(std::string what, double delay_s)
    : what_(std::move(what)), delay_s_(delay_s), start_(std::chrono::steady_clock::now()) {
  if (isatty(STDERR_FILENO)) ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() {
  if (!ticker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  wake_.notify_one();
  ticker_.join();
  if (shown_) std::fprintf(stderr, "\r\033[K");  // erase the line: what follows starts clean
}

void Progress::tick() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [this] { return done_; })) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (s < delay_s_) continue;
    const double f = fraction_.load(std::memory_order_relaxed);
    if (f >= 0) std::fprintf(stderr, "\r\033[K%s: %3.0f%%, %.0f s", what_.c_str(), 100 * f, s);
    else std::fprintf(stderr, "\r\033[K%s: %.0f s", what_.c_str(), s);
    std::fflush(stderr);
    shown_ = true;
  }
}

}  // namespace flashlite::cli
