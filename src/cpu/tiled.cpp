// PLACEHOLDER until the tiled kernel lands: forwards to the naive path so the build links.
#include "backends.h"

namespace flashlite {

const char* cpu_tiled_variant() { return "portable"; }
void run_cpu_tiled(const AttentionProblem& p) { run_cpu_naive(p); }

}  // namespace flashlite
