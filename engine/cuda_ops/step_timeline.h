#pragma once
// The engine's decode-step timeline (FLASHLITE_ENGINE_TIMELINE=1 in builds with -DFLASHLITE_DECODE_TIMELINE=1;
// docs/perf-notes.md "Engine round 9"): where each kernel's blocks' %globaltimer stamps go, and the per-layer table
// printed from them. One buffer: the decode kernels' stamps (a slot per layer), then the GEMVs' (a slot per layer
// and site: QKV, O, gate/up, down; then the LM head). Host code only.
#include <cstddef>
#include <cstdio>

namespace flashlite::engine::cuda_ops {

struct StepTimeline {
  static constexpr size_t kBlocks = 1024;  // blocks a slot holds (the largest batch-1 grid: 512)
  static constexpr int kSites = 4;         // GEMVs per layer: QKV, O, gate/up, down
  int layers = 0;

  size_t decode_words() const;                // the decode slots, first in the buffer
  size_t words() const;                       // the whole buffer
  size_t gemv_offset(int layer, int site) const;  // words from the buffer's start to a GEMV slot
};

// Per layer, each kernel's first start / median past the wait and prologue / last end (us from the layer's first QKV
// block; the attention also its stamps' medians), then the mean gaps and run times over layers 1.., from the
// buffer's host copy.
void print_step_timeline(const StepTimeline& t, const unsigned long long* host, std::FILE* out);

}  // namespace flashlite::engine::cuda_ops
