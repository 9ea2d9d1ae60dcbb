#pragma once
// Errors thrown by flashlite. Every message names the argument, its value and what was expected.
#include <stdexcept>
#include <string>

namespace flashlite {

// What kind of mistake: maps onto Python's ValueError / TypeError / RuntimeError.
enum class ErrorKind { invalid_value, invalid_type, runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace flashlite
