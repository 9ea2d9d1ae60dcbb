#pragma once
// Strict parsing of the CUDA engine's FLASHLITE_ENGINE_* switches (engine/cuda_ops/llama_cuda.cpp, pdl.cuh). Unset
// or empty means the switch's default; anything else must be a value the switch documents, or the engine fails (the
// usual flashlite::Error, invalid_value) with a message naming the variable, the value found and what is expected.
//   flags:        0 / off / false / no and 1 / on / true / yes (case-insensitive);
//   integers:     optional sign and decimal digits only (strtol, whole string), within a stated range;
//   enumerations: exactly the listed names (case-insensitive), which may include the flag words.
// Pure C++ (no CUDA), so the parsing is testable on any machine (tests/engine/cuda_model_test.cpp).
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/errors.h"

namespace flashlite::engine::env_switch {

struct Name {
  const char* name;
  int value;
};

[[noreturn]] inline void reject(const char* var, const char* value, const std::string& expected) {
  fail(std::string(var) + "=" + value + "; expected " + expected);
}

inline bool same_word(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b)
    if (std::tolower(static_cast<unsigned char>(*a)) != std::tolower(static_cast<unsigned char>(*b))) return false;
  return *a == *b;
}

inline bool is_unset(const char* value) { return value == nullptr || *value == '\0'; }

// One of `names` (case-insensitive), `fallback` when unset or empty.
inline int parse_choice(const char* var, const char* value, int fallback, const std::vector<Name>& names,
                        const std::string& expected) {
  if (is_unset(value)) return fallback;
  for (const Name& n : names)
    if (same_word(value, n.name)) return n.value;
  reject(var, value, expected);
}

// The flag words mapped to `off` and `on`, then `extra` (an enumeration that is a flag plus named modes).
inline std::vector<Name> flag_names(int off, int on, std::initializer_list<Name> extra = {}) {
  std::vector<Name> names = {{"0", off}, {"off", off}, {"false", off}, {"no", off},
                             {"1", on},  {"on", on},   {"true", on},   {"yes", on}};
  names.insert(names.end(), extra.begin(), extra.end());
  return names;
}
inline const char* flag_expected() { return "0, off, false or no (off) or 1, on, true or yes (on)"; }

inline bool parse_flag(const char* var, const char* value, bool fallback) {
  return parse_choice(var, value, fallback ? 1 : 0, flag_names(0, 1), flag_expected()) != 0;
}

// A decimal integer in [lo, hi], `fallback` when unset or empty.
inline int parse_int(const char* var, const char* value, int fallback, int lo, int hi, const std::string& expected) {
  if (is_unset(value)) return fallback;
  if (std::isspace(static_cast<unsigned char>(*value))) reject(var, value, expected);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || errno == ERANGE || v < lo || v > hi) reject(var, value, expected);
  return int(v);
}

// A decimal integer among `allowed`, `fallback` when unset or empty.
inline int parse_int_in(const char* var, const char* value, int fallback, std::initializer_list<int> allowed,
                        const std::string& expected) {
  const int v = parse_int(var, value, fallback, INT_MIN, INT_MAX, expected);
  for (int a : allowed)
    if (v == a) return v;
  reject(var, value, expected);
}

// The same, read from the environment.
inline const char* raw(const char* var) { return std::getenv(var); }
inline int choice(const char* var, int fallback, const std::vector<Name>& names, const std::string& expected) {
  return parse_choice(var, raw(var), fallback, names, expected);
}
inline bool flag(const char* var, bool fallback) { return parse_flag(var, raw(var), fallback); }
inline int integer(const char* var, int fallback, int lo, int hi, const std::string& expected) {
  return parse_int(var, raw(var), fallback, lo, hi, expected);
}
inline int integer_in(const char* var, int fallback, std::initializer_list<int> allowed, const std::string& expected) {
  return parse_int_in(var, raw(var), fallback, allowed, expected);
}

}  // namespace flashlite::engine::env_switch
