#include "engine/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "engine/errors.h"
#include "engine/tokenizer.h"

namespace flashlite::engine {

namespace {

// Constructs that compile in both engines but mean different things: Oniguruma (Ruby syntax, what Hugging Face
// `tokenizers` uses) reads `\h` as a hex digit and `(?m)` as dot-matches-newline, and has no `(?s)`. Returns the
// offending construct, or empty when there is none.
std::string oniguruma_only_construct(const std::string& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 'h' || p[i + 1] == 'H') return p.substr(i, 2);
      ++i;
      continue;
    }
    if (p[i] == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      size_t j = i + 2;
      while (j < p.size() && (std::isalpha(static_cast<unsigned char>(p[j])) || p[j] == '-')) ++j;
      if (j > i + 2 && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        const std::string flags = p.substr(i + 2, j - i - 2);
        if (flags.find_first_of("ms") != std::string::npos) return p.substr(i, j - i + 1);
      }
    }
  }
  return "";
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& what) : impl_(std::make_unique<Impl>()) {
  if (const std::string c = oniguruma_only_construct(pattern); !c.empty()) {
    fail(what + " '" + pattern + "' uses '" + c +
         "', which Oniguruma (Hugging Face tokenizers) and PCRE2 read differently: unsupported");
  }
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &err, &err_off,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(what + " '" + pattern + "' is unsupported: PCRE2 cannot compile it (offset " + std::to_string(err_off) +
         ": " + reinterpret_cast<const char*>(msg) + ")");
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
}

Regex::~Regex() = default;

bool Regex::may_match_empty() const {
  uint32_t min_length = 0;
  pcre2_pattern_info(impl_->code, PCRE2_INFO_MINLENGTH, &min_length);
  return min_length == 0;
}

std::string Regex::escape(std::string_view literal) {
  std::string re;
  re.reserve(literal.size() * 2);
  for (char c : literal) {  // a backslash before any ASCII non-alphanumeric makes it literal in PCRE2
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) re += '\\';
    re += c;
  }
  return re;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> spans;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!md) fail_runtime("out of memory creating regex match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t last_end = 0, last_match_end = 0;
  bool have_match = false;
  while (last_end <= subject.size()) {
    int rc = pcre2_match(impl_->code, s, subject.size(), last_end, 0, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(impl_->code, s, subject.size(), last_end, PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail_runtime(std::string("regex match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (b == e && have_match && e == last_match_end) {
      // An empty match right where the last one ended: step over one character and search again.
      if (last_end >= subject.size()) break;
      last_end += utf8_chars(subject.substr(last_end, 4)).front().size();
      continue;
    }
    spans.emplace_back(b, e);
    last_end = last_match_end = e;
    have_match = true;
  }
  pcre2_match_data_free(md);
  return spans;
}

}  // namespace flashlite::engine
