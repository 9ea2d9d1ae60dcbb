#pragma once
// A compiled PCRE2 regex (UTF-8, Unicode properties for \p{L} \p{N} \s, JIT when available) used by the
// tokenizers' pre-tokenizers and normalizers, matching the way Hugging Face `tokenizers` runs its Oniguruma
// patterns: `^` and `$` match at line boundaries, and matches are iterated like Rust's find_iter (empty matches
// included, except one right where the previous match ended). Invalid UTF-8 in the subject never fails: those
// bytes just do not match.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashlite::engine {

class Regex {
 public:
  // Throws Error naming `what` (e.g. "pre_tokenizer.pattern.Regex") when PCRE2 cannot compile the pattern or the
  // pattern uses a construct that means something else in Oniguruma (`\h`, `(?m)`, `(?s)`): "unsupported".
  explicit Regex(const std::string& pattern, const std::string& what = "regex");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Byte spans [begin, end) of all non-overlapping matches, left to right; empty matches included.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

  // True when the pattern may match empty text (PCRE2's minimum match length is 0).
  bool may_match_empty() const;

  // `literal` as a pattern that matches exactly that text.
  static std::string escape(std::string_view literal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashlite::engine
