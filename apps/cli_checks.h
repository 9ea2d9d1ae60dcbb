#pragma once
// Argument checks shared by the subcommands: range validators with human messages, strict integer lists, the
// memory a run would need (checked before anything is allocated), and the subcommand words of a command line.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace flashlite::cli {

// CLI11's Range prints its bounds with %f (300 digits for "no upper bound") and its NonNegativeNumber wraps nothing;
// these say "must be >= 0 (got -1)" and reject what is not a number of the option's kind.
CLI::Validator int_at_least(int64_t lo);
CLI::Validator int_between(int64_t lo, int64_t hi);
CLI::Validator real_at_least(double lo);
CLI::Validator real_between(double lo, double hi);
// Digits only, within uint64: strtoull (CLI11's conversion) reads "-1" as 2^64 - 1.
CLI::Validator unsigned_integer();

// "1,2 3" -> {1, 2, 3}: commas and/or blanks between integers; anything else is an error naming `option`, the element
// and its position (1-based).
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option);

// a * b * ..., or -1 when the product overflows int64 (callers then report the sizes as too large).
int64_t checked_product(std::initializer_list<int64_t> factors);
// a + b, or -1 when either is -1 or the sum overflows.
int64_t checked_sum(int64_t a, int64_t b);

// Memory this process could still take (MemAvailable of /proc/meminfo; physical memory when unreadable).
int64_t available_memory_bytes();
// "3.2 GiB", "512 MiB", "12 KiB".
std::string format_bytes(int64_t bytes);
// Throws Error "`what` need(s) N but only M of memory is available; `advice`" when `bytes` (-1: overflowed) does not fit
// in the available memory.
void require_memory(int64_t bytes, const std::string& what, const std::string& advice);

// CLI11 answers a misspelt or missing subcommand with "A subcommand is required"; this names the word and lists the
// choices instead (throws CLI::ParseError). Walks the words before CLI11 parses them; leaves --help / --version alone.
void check_subcommand_words(const CLI::App& app, int argc, const char* const* argv);
// Where in argv a "--" right after a pass-through subcommand (`bench cpu -- --quick`) sits, or 0. That mark only says
// where the other program's arguments start; CLI11 would hand the words after it to flashlite's own positionals.
int passthrough_mark(const CLI::App& app, int argc, const char* const* argv);

}  // namespace flashlite::cli
