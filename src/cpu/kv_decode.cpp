// CPU decode over a KV cache (contiguous or paged): the padded prefill problem it is (q_len rows per sequence), run by
// cpu_prefill: per sequence, the tiled forward kernel (forward()'s CPU code and numerics, its small-q decode path
// included) over a strided view of a contiguous cache or, paged, over the sequence's pages read in place.
#include "kv/kv_backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {

void cpu_decode(const DecodeProblem& p) { cpu_prefill(prefill_from_decode(p)); }

}  // namespace flashlite
