#pragma once
// A compiled PCRE2 regex (UTF-8, Unicode properties for \p{L} \p{N} \s, JIT when available) used by the
// tokenizers' pre-tokenizers. Invalid UTF-8 in the subject never fails: those bytes just do not match.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashlite::engine {

class Regex {
 public:
  explicit Regex(const std::string& pattern);  // throws Error with PCRE2's message and offset
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Byte spans [begin, end) of all non-overlapping, non-empty matches, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashlite::engine
