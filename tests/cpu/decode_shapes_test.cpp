// Backend::cpu on decode shapes against the float64 reference. A task with at most 8 query columns (q rows x the GQA
// group) takes the cpu backend's small-q path (keys as vector lanes, chunks of up to 256 keys; src/cpu/tiled.cpp,
// run_task_small), so this grid is built around it: q_len 1..4, groups of 1, 2, 4 and 8, head_dim 8 / 64 / 128 and odd
// ones, key counts below, at and across the vector width and the chunk size, every mask feature, every dtype, strided
// layouts, varlen batches of single rows. Each case also runs with a group just over the limit (the tiled path) so
// the boundary between the two is covered. Inputs random, outputs and LSE NaN-poisoned (test_util.h).
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "test_util.h"

namespace fltest {
namespace {

struct DecodeCase {
  std::string name;
  Spec spec;
};

std::vector<DecodeCase> build_grid() {
  std::vector<DecodeCase> cases;
  std::map<std::string, int> seen;
  const auto add = [&](const std::string& group, const Spec& s) {
    std::string name = group + "_" + describe(s);
    if (int n = seen[name]++) name.append("_").append(std::to_string(n + 1));
    cases.push_back({name, s});
  };

  // Shapes: q_len x group <= 8 (small path), plus q_len 3 and 4 with group 4 (12, 16 columns: the tiled path).
  // Keys: 1, 7, 8, 9 (vector tails), 255..257 and 300 (the 256-key chunk for head_dim 8), 1025 (several chunks).
  int idx = 0;
  for (int64_t sq : {1, 2, 3, 4}) {
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 4}, {4, 4}, {8, 1}, {16, 4}}) {
      for (int64_t d : {8, 64, 128, 7, 40}) {
        for (int64_t sk : {1, 9, 257, 300}) {
          if (sk < sq) continue;
          Spec s = shape(1, sq, sk, hq, hkv, d);
          s.mask.causal = idx % 2 == 0;
          if (idx % 5 == 4) s.lse = LseMode::none;
          ++idx;
          add("shape", s);
        }
      }
    }
  }
  for (int64_t sk : {7, 8, 16, 255, 256, 1025}) {
    Spec s = shape(2, 1, sk, 8, 4, 8);
    s.mask.causal = true;
    add("keys", s);
  }

  // Every mask feature at decode shapes, every dtype; windows and sinks put the chunk and key-range edges mid-chunk.
  struct MaskCase {
    MaskSpec mask;
    bool sink_logits = false;
    double softcap = 0;
    std::optional<double> scale;
    double input_std = 1.0;
  };
  const std::vector<MaskCase> masks = {
      {{true, -1, -1, 0}},                       // causal
      {{true, 8, -1, 0}},                        // causal sliding window
      {{true, 100, -1, 4}},                      // StreamingLLM: sinks + window, two key ranges
      {{true, 250, -1, 3}},                      // sinks touching the window: merged range
      {{false, 5, 7, 2}},                        // two-sided window (with q_len > 1: rows see different keys)
      {{false, -1, -1, 0}, true},                // sink logits
      {{true, 0, -1, 0}, true},                  // the diagonal only + sink logits
      {{false, -1, -1, 0}, false, 2.0, {}, 3.0}, // softcap that bites
      {{true, 16, -1, 2}, true, 5.0, -0.3},      // everything, negative scale
      {{false, -1, -1, 0}, false, 0, 0.0},       // scale 0: uniform weights
      {{true, -1, -1, 0}, false, 0, 1.0, 3.0},   // logits in the tens to hundreds
  };
  for (const MaskCase& m : masks) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (auto [sq, d] : {std::pair<int64_t, int64_t>{1, 8}, {3, 64}, {2, 128}}) {
        Spec s = shape(2, sq, 300, 8, 4, d, t);
        s.mask = m.mask;
        s.sink_logits = m.sink_logits;
        s.softcap = m.softcap;
        s.scale = m.scale;
        s.input_std = m.input_std;
        add("mask", s);
      }
    }
  }
  {  // q longer than k under causal: the first rows see nothing (zeros, LSE -inf or the sink logit).
    Spec s = shape(1, 4, 2, 4, 2, 8);
    s.mask.causal = true;
    add("masked_rows", s);
    s.sink_logits = true;
    add("masked_rows", s);
  }

  // Strided inputs and outputs (fp32 K/V read in place at head_dim 8/64, converted at 7/40).
  struct LayoutCase {
    Layout in, out;
    LseMode lse;
  };
  for (LayoutCase l : {LayoutCase{Layout::padded, Layout::padded, LseMode::transposed},
                       LayoutCase{Layout::heads_major, Layout::seq_first, LseMode::contiguous},
                       LayoutCase{Layout::packed_qkv, Layout::heads_major, LseMode::transposed}}) {
    for (DType t : {DType::f32, DType::bf16}) {
      for (int64_t d : {8, 64, 7}) {
        Spec s = shape(2, 2, 70, 8, 4, d, t);
        s.mask = {true, 30, -1, 2};
        s.in_layout = l.in, s.out_layout = l.out, s.lse = l.lse;
        add("layout", s);
      }
    }
  }

  // Batched decode as an engine issues it: one query row per sequence, different cached lengths (empty ones too).
  for (DType t : {DType::f32, DType::f16}) {
    for (int64_t d : {8, 64}) {
      Spec s = shape(1, 0, 0, 8, 4, d, t);
      s.mask.causal = true;
      s.varlen_q = {1, 1, 1, 1, 0, 1};
      s.varlen_k = {1, 300, 0, 17, 5, 1025};
      s.extra_rows = 2;
      add("varlen", s);
    }
  }
  return cases;
}

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

const std::vector<DecodeCase>& grid() {
  static const std::vector<DecodeCase> cases = build_grid();
  return cases;
}

class DecodeShapes : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeShapes, MatchesReference) {
  const DecodeCase& c = GetParam();
  Problem p(c.spec, seed_of(c.name));
  const Snapshot before = snapshot(p);
  const Result64 ref = reference64(p);
  p.args.backend = Backend::cpu;
  flashlite::forward(p.args);
  expect_matches(p, ref, before, Tolerance{});
}

INSTANTIATE_TEST_SUITE_P(Cpu, DecodeShapes, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) { return info.param.name; });

// The same problem twice in a row on one thread (the per-thread scratch is reused, grown by the first call) and
// after a bigger one: results must not depend on what the scratch held.
TEST(DecodeShapesScratch, ReuseGivesTheSameResult) {
  Spec big = shape(1, 4, 1025, 8, 4, 128);
  Problem pb(big, 7);
  pb.args.backend = Backend::cpu;
  flashlite::forward(pb.args);
  for (int rep = 0; rep < 2; ++rep) {
    Spec s = shape(1, 1, 300, 8, 4, 8);
    s.mask.causal = true;
    Problem p(s, 11);
    const Snapshot before = snapshot(p);
    const Result64 ref = reference64(p);
    p.args.backend = Backend::cpu;
    flashlite::forward(p.args);
    expect_matches(p, ref, before, Tolerance{});
  }
}

}  // namespace
}  // namespace fltest
