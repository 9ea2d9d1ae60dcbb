#pragma once
// Engine errors: every failure is a flashlite::Error whose message names the file or argument, the value found
// and what was expected. The CLI prints the message and exits non-zero; nothing in the engine aborts.
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "flashlite/errors.h"

namespace flashlite::engine {

[[noreturn]] inline void fail(const std::string& message) { throw Error(ErrorKind::invalid_value, message); }
[[noreturn]] inline void fail_runtime(const std::string& message) { throw Error(ErrorKind::runtime, message); }

// nlohmann's exception text without its "[json.exception.parse_error.101] " tag, for messages users read.
inline std::string json_error_text(const std::exception& e) {
  const std::string what = e.what();
  const size_t cut = what.find("] ");
  return what.rfind("[json.exception.", 0) == 0 && cut != std::string::npos ? what.substr(cut + 2) : what;
}

// A size computed from numbers read from a file (checkpoint headers, config.json). Every + and * is checked: an
// overflow throws an Error naming `what` (which must outlive the expression) instead of wrapping around to a
// small size that every later comparison with the file would accept.
class CheckedSize {
 public:
  CheckedSize(uint64_t value, std::string_view what) : v_(value), what_(what) {}
  uint64_t value() const { return v_; }
  CheckedSize operator+(uint64_t b) const {
    uint64_t r;
    if (__builtin_add_overflow(v_, b, &r)) overflow();
    return {r, what_};
  }
  CheckedSize operator*(uint64_t b) const {
    uint64_t r;
    if (__builtin_mul_overflow(v_, b, &r)) overflow();
    return {r, what_};
  }
  CheckedSize operator+(const CheckedSize& b) const { return *this + b.v_; }
  CheckedSize operator*(const CheckedSize& b) const { return *this * b.v_; }
  CheckedSize round_up(uint64_t multiple) const {
    return CheckedSize((*this + (multiple - 1)).v_ / multiple, what_) * multiple;
  }

 private:
  [[noreturn]] void overflow() const { fail(std::string(what_) + " overflows 64 bits (corrupt or hostile sizes)"); }
  uint64_t v_;
  std::string_view what_;
};

}  // namespace flashlite::engine
