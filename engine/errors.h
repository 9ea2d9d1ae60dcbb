#pragma once
// Engine errors: every failure is a flashlite::Error whose message names the file or argument, the value found
// and what was expected. The CLI prints the message and exits non-zero; nothing in the engine aborts.
#include <string>

#include "flashlite/errors.h"

namespace flashlite::engine {

[[noreturn]] inline void fail(const std::string& message) { throw Error(ErrorKind::invalid_value, message); }
[[noreturn]] inline void fail_runtime(const std::string& message) { throw Error(ErrorKind::runtime, message); }

}  // namespace flashlite::engine
