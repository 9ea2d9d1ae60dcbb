#include "engine/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/errors.h"

namespace flashlite::engine {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer regex '" + pattern + "' does not compile at offset " + std::to_string(err_off) + ": " +
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> spans;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!md) fail_runtime("out of memory creating regex match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos <= subject.size()) {
    const int rc = pcre2_match(impl_->code, s, subject.size(), pos, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail_runtime(std::string("regex match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      spans.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one character (a whole UTF-8 sequence) and look again.
      pos = b + 1;
      while (pos < subject.size() && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return spans;
}

}  // namespace flashlite::engine
