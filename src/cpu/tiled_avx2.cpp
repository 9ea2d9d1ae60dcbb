// The tiled CPU kernel compiled for the avx2 instruction set (see tiled_kernel.inc; flags set in src/CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "common/problem.h"
#include "flashlite/errors.h"

namespace flashlite::cpu_avx2 {
namespace {
// Included inside this anonymous namespace so no inline function is shared with another ISA's translation unit.
#include "common/half.h"
using namespace flashlite;  // the copy of half.h just included in this namespace
#include "cpu/tiled_kernel.inc"
}  // namespace

void run_tiled(const AttentionProblem& p) { run_tiled_impl(p); }

}  // namespace flashlite::cpu_avx2
