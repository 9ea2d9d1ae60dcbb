#include "cli_checks.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "flashlite/errors.h"

namespace flashlite::cli {

namespace {

// The whole of `s` as a base-10 int64 (an optional '-', then digits); false on anything else or overflow.
bool parse_int64(const std::string& s, int64_t& out) {
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end && !s.empty();
}

bool parse_real(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

std::string real_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Why `s` is not an integer in [lo, hi], or empty.
std::string integer_problem(const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!parse_int64(s, v)) {
    const bool digits = !s.empty() && s.find_first_not_of("-0123456789") == std::string::npos;
    return digits ? "'" + s + "' is too large" : "'" + s + "' is not an integer";
  }
  if (v < lo) return "must be >= " + std::to_string(lo) + " (got " + s + ")";
  if (v > hi) return "must be <= " + std::to_string(hi) + " (got " + s + ")";
  return {};
}

std::string real_problem(const std::string& s, double lo, double hi) {
  double v = 0;
  if (!parse_real(s, v)) return "'" + s + "' is not a finite number";
  if (v < lo) return "must be >= " + real_text(lo) + " (got " + s + ")";
  if (v > hi) return "must be <= " + real_text(hi) + " (got " + s + ")";
  return {};
}

constexpr int64_t kNoMax = INT64_MAX;

}  // namespace

CLI::Validator int_at_least(int64_t lo) {
  return {[lo](std::string& s) { return integer_problem(s, lo, kNoMax); }, std::to_string(lo) + " or more"};
}

CLI::Validator int_between(int64_t lo, int64_t hi) {
  return {[lo, hi](std::string& s) { return integer_problem(s, lo, hi); },
          std::to_string(lo) + " to " + std::to_string(hi)};
}

CLI::Validator real_at_least(double lo) {
  return {[lo](std::string& s) { return real_problem(s, lo, HUGE_VAL); }, real_text(lo) + " or more"};
}

CLI::Validator real_between(double lo, double hi) {
  return {[lo, hi](std::string& s) { return real_problem(s, lo, hi); }, real_text(lo) + " to " + real_text(hi)};
}

CLI::Validator unsigned_integer() {
  return {[](std::string& s) -> std::string {
            if (!s.empty() && s[0] == '-') return "must be >= 0 (got " + s + ")";
            uint64_t v = 0;
            const char* end = s.data() + s.size();
            const auto [ptr, ec] = std::from_chars(s.data(), end, v);
            if (ec == std::errc::result_out_of_range) return "'" + s + "' is too large (at most 18446744073709551615)";
            if (ec != std::errc() || ptr != end || s.empty()) return "'" + s + "' is not a non-negative integer";
            return {};
          },
          "0 or more"};
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> values;
  size_t i = 0, element = 0;
  const auto blank = [&](size_t j) { return j < text.size() && std::isspace(static_cast<unsigned char>(text[j])); };
  while (true) {
    while (blank(i)) ++i;
    if (i == text.size()) break;
    ++element;
    size_t j = i;
    while (j < text.size() && text[j] != ',' && !blank(j)) ++j;
    const std::string item = text.substr(i, j - i);
    int64_t v = 0;
    if (item.empty()) {
      throw Error(ErrorKind::invalid_value, option + " element " + std::to_string(element) + " is empty (in '" + text + "')");
    }
    if (!parse_int64(item, v)) {
      throw Error(ErrorKind::invalid_value, option + " element " + std::to_string(element) + " is '" + item +
                                                "'; expected an integer (list: '" + text + "')");
    }
    values.push_back(v);
    i = j;
    while (blank(i)) ++i;
    if (i < text.size() && text[i] == ',') {
      ++i;
      while (blank(i)) ++i;
      if (i == text.size() || text[i] == ',') {
        throw Error(ErrorKind::invalid_value, option + " element " + std::to_string(element + 1) + " is empty (in '" + text + "')");
      }
    }
  }
  return values;
}

int64_t checked_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return -1;
  }
  return p;
}

int64_t checked_sum(int64_t a, int64_t b) {
  int64_t s = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &s)) return -1;
  return s;
}

namespace {

// The first number in a file, or -1 (absent, or "max").
int64_t number_in(const char* path) {
  std::ifstream in(path);
  int64_t v = -1;
  return in >> v ? v : -1;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t available = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") available = kib * 1024;
  }
  // A container's limit (cgroup v2) is often below the machine's free memory.
  const int64_t limit = number_in("/sys/fs/cgroup/memory.max"), used = number_in("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) available = std::min(available, std::max<int64_t>(0, limit - used));
  return available;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

void require_memory(int64_t bytes, const std::string& what, const std::string& advice) {
  const int64_t available = available_memory_bytes();
  if (bytes >= 0 && bytes <= available) return;
  const std::string need = bytes < 0 ? "more than 8 EiB" : format_bytes(bytes);
  throw Error(ErrorKind::invalid_value, what + " would need " + need + " but " + format_bytes(available) +
                                            " of memory is available; " + advice);
}

namespace {

const CLI::App* subcommand_named(const CLI::App& app, const std::string& name) {
  const auto named = app.get_subcommands([&](const CLI::App* s) { return s->get_name() == name; });
  return named.empty() ? nullptr : named.front();
}

std::string subcommand_list(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return names;
}

}  // namespace

void check_subcommand_words(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* at = &app;
  std::string path = "flashlite";
  for (int i = 1; i < argc && at->get_require_subcommand_min() > 0; ++i) {
    const std::string word = argv[i];
    if (word == "-h" || word == "--help" || word == "--version") return;
    if (word.rfind('-', 0) == 0) continue;  // a flag of this level (none above the leaves takes a value)
    const CLI::App* next = subcommand_named(*at, word);
    if (!next) {
      throw CLI::ParseError(path + ": unknown subcommand '" + word + "'; expected one of: " + subcommand_list(*at),
                            CLI::ExitCodes::ExtrasError);
    }
    at = next;
    path += " " + word;
  }
  if (at->get_require_subcommand_min() > 0) {
    throw CLI::ParseError(path + " needs a subcommand: one of " + subcommand_list(*at) + " ('" + path +
                              " --help' describes them)",
                          CLI::ExitCodes::RequiredError);
  }
}

int passthrough_mark(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (at->get_prefix_command()) return word == "--" ? i : 0;
    if (word.rfind('-', 0) == 0) continue;
    at = subcommand_named(*at, word);
    if (!at) return 0;
  }
  return 0;
}

}  // namespace flashlite::cli
