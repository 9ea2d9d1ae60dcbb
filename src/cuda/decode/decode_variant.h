#pragma once
// Opt-in variants of the CUDA decode path (round-5 experiments, docs/perf-notes.md "Decode"); off by default, read
// once per process from the environment, host-only header (no CUDA types):
//   FLASHLITE_DECODE_PREFETCH=N  (0..8, default 0) the split kernel L2-prefetches the first N key tiles of its split
//                                before it waits for the previous grid (griddepcontrol.wait, sm_90): the first DRAM
//                                round trip overlaps the previous kernel's tail instead of following it. Caches with
//                                dense token rows only (kv heads side by side); others run the default path.
//   FLASHLITE_DECODE_WAVES=W     (1..8, default 1) the split plan fills W waves of resident blocks instead of one
//                                (more, shorter splits; the block scheduler hands the next split to whichever SM is
//                                free first). Planning only: the kernels are the same.
namespace flashlite::cuda_decode {

struct DecodeVariant {
  int prefetch_tiles = 0;
  int waves = 1;
};

// The variant in force: the test override if one is set, else the environment (read once).
DecodeVariant decode_variant();

// Tests only: run this process's next decodes (plans included) with `v` instead of the environment's choice, until
// reset. Not thread-safe against concurrent decode() calls.
void set_decode_variant_for_testing(const DecodeVariant& v);
void reset_decode_variant_for_testing();

}  // namespace flashlite::cuda_decode
