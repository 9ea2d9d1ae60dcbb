// Backend::naive and Backend::cpu against the float64 reference over a designed grid (not the full cartesian
// product): every listed sequence length, head_dim, GQA ratio, mask, dtype, memory layout and varlen shape is covered,
// together with the combinations that matter. Outputs and LSE are NaN-poisoned before each call; padding and rows
// outside every sequence are NaN in the inputs too (see test_util.h). Large sequences use few heads: the float64
// reference is O(S^2 D).
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "test_util.h"

namespace fltest {
namespace {

struct GridCase {
  std::string name;
  Spec spec;
};

struct MaskCase {
  MaskSpec mask;
  bool sink_logits = false;
  double softcap = 0;
  std::optional<double> scale;
  double input_std = 1.0;
};

std::vector<MaskCase> all_masks() {
  return {
      {{false, -1, -1, 0}},                    // none
      {{true, -1, -1, 0}},                     // causal
      {{false, 8, -1, 0}},                     // left window
      {{false, 8, 4, 0}},                      // two-sided window
      {{false, -1, 3, 0}},                     // right window only
      {{false, 0, 0, 0}},                      // the diagonal only
      {{true, 16, -1, 0}},                     // causal sliding window
      {{false, -1, -1, 4}},                    // sink tokens without a window: no effect
      {{false, 8, -1, 4}},                     // StreamingLLM: sinks + window
      {{true, 8, -1, 3}},                      // causal + window + sinks
      {{true, 0, -1, 0}},                      // causal window 0: the diagonal
      {{false, 1000, 1000, 0}},                // window wider than the sequence
      {{false, 2, -1, 100}},                   // more sink tokens than keys
      {{false, -1, -1, 0}, true},              // sink logits
      {{true, -1, -1, 0}, true},               // causal + sink logits (masked rows keep only the sink)
      {{false, -1, -1, 0}, false, 2.0, {}, 2.0},                // softcap that bites
      {{true, 16, 0, 2}, true, 3.0, 0.2},                       // everything, causal
      {{false, 5, 7, 3}, true, 4.0},                            // everything, not causal
      {{false, -1, -1, 0}, false, 0, 1.0, 3.0},                 // logits in the hundreds
      {{true, 6, -1, 1}, false, 0, 1.0, 3.0},                   // large logits + skipped tiles
  };
}

std::vector<GridCase> build_grid() {
  std::vector<GridCase> cases;
  std::map<std::string, int> seen;
  const auto add = [&](const std::string& group, Spec s) {
    std::string name = group + "_" + describe(s);
    if (int n = seen[name]++) name.append("_").append(std::to_string(n + 1));
    cases.push_back({name, s});
  };
  const auto with_mask = [](Spec s, const MaskCase& m) {
    s.mask = m.mask;
    s.sink_logits = m.sink_logits;
    s.softcap = m.softcap;
    s.scale = m.scale;
    s.input_std = m.input_std;
    return s;
  };

  // Sequence lengths 1, 2, 17, 64, 1000, 1025, equal and unequal both ways, causal and not.
  const std::vector<std::pair<int64_t, int64_t>> small = {{1, 1},   {2, 2},     {17, 17},  {64, 64},    {1, 64},
                                                          {64, 1},  {2, 17},    {17, 2},   {17, 1025},  {1025, 17},
                                                          {1, 1000}, {1000, 1}, {64, 1000}, {1000, 64}, {2, 1025}};
  for (auto [sq, sk] : small) {
    for (bool causal : {false, true}) {
      Spec s = shape(2, sq, sk, 4, 2, 64);
      s.mask.causal = causal;
      add("seq", s);
    }
  }
  struct Big {
    int64_t sq, sk, hq, hkv, d;
  };
  for (Big b : {Big{1000, 1000, 1, 1, 64}, Big{1025, 1025, 2, 1, 32}, Big{1000, 1025, 1, 1, 128}, Big{1025, 1000, 1, 1, 64}}) {
    for (bool causal : {false, true}) {
      Spec s = shape(1, b.sq, b.sk, b.hq, b.hkv, b.d);
      s.mask.causal = causal;
      add("bigseq", s);
    }
  }
  {
    Spec s = shape(1, 1025, 1025, 1, 1, 64, DType::bf16);
    s = with_mask(s, {{true, 300, -1, 4}, true, 20.0});
    add("bigseq", s);
    add("bigseq", shape(1, 1000, 1000, 1, 1, 96, DType::f16));
    Spec w = shape(1, 1025, 1000, 2, 2, 64);
    w.mask = {false, 100, 50, 2};
    w.in_layout = Layout::heads_major;
    add("bigseq", w);
    // Whole tiles invisible: q much longer than k under causal leaves hundreds of rows with no key at all (they must
    // still be written: zeros, LSE -inf), and a narrow window leaves most key tiles of every row skipped.
    Spec masked_rows = shape(1, 1000, 300, 2, 1, 64);
    masked_rows.mask = {true, 64, -1, 0};
    add("bigseq", masked_rows);
    Spec narrow = shape(1, 300, 1000, 2, 1, 40, DType::f16);
    narrow.mask = {false, 32, 0, 3};
    narrow.sink_logits = true;
    add("bigseq", narrow);
  }

  // head_dim: every listed size, odd ones, the CPU maximum, and tails shorter than any vector.
  int idx = 0;
  for (int64_t d : {1, 7, 32, 40, 64, 72, 96, 128, 256, 512}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      Spec s = shape(1, 33, 77, 4, 2, d, t);
      s.mask.causal = idx % 2 == 1;
      if (idx % 3 == 2) s.lse = LseMode::none;
      ++idx;
      add("hdim", s);
    }
  }
  {
    Spec s = shape(1, 64, 1025, 1, 1, 256, DType::bf16);
    s.mask.causal = true;
    add("hdim", s);
    add("hdim", shape(1, 1025, 64, 1, 1, 256));
  }

  // GQA ratios 1, 2, 4, 8 and 3 (6 q heads over 2 kv heads), MQA.
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {8, 2}, {8, 1}, {6, 2}, {16, 2}}) {
    for (DType t : {DType::f32, DType::bf16}) {
      for (bool masked : {false, true}) {
        Spec s = shape(2, 40, 70, hq, hkv, 64, t);
        if (masked) s.mask = {true, 16, -1, 0};
        add("gqa", s);
      }
    }
  }

  // Every mask and their combinations, every dtype; q longer than k gives fully masked rows.
  for (const MaskCase& m : all_masks()) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{47, 80}, {80, 47}}) {
        add("mask", with_mask(shape(2, sq, sk, 4, 2, 64, t), m));
      }
    }
  }

  // Strided inputs and outputs: padding, permuted storage, packed qkv; LSE transposed or absent.
  struct LayoutCase {
    Layout in, out;
    LseMode lse;
  };
  const std::vector<LayoutCase> layouts = {
      {Layout::padded, Layout::contiguous, LseMode::contiguous},
      {Layout::heads_major, Layout::heads_major, LseMode::transposed},
      {Layout::seq_first, Layout::padded, LseMode::contiguous},
      {Layout::packed_qkv, Layout::contiguous, LseMode::transposed},
      {Layout::packed_qkv, Layout::seq_first, LseMode::contiguous},
      {Layout::contiguous, Layout::padded, LseMode::transposed},
      {Layout::padded, Layout::padded, LseMode::none},
  };
  for (const LayoutCase& l : layouts) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      Spec a = shape(2, 37, 37, 6, 2, 72, t);
      a.mask.causal = true;
      Spec b = shape(3, 20, 45, 4, 1, 40, t);
      b.mask = {false, 5, -1, 2};
      for (Spec s : {a, b}) {
        s.in_layout = l.in, s.out_layout = l.out, s.lse = l.lse;
        add("layout", s);
      }
    }
  }

  // Varlen: empty and length-1 sequences, k-empty sequences (fully masked rows), rows past the last sequence.
  const std::vector<MaskCase> varlen_masks = {
      {{false, -1, -1, 0}}, {{true, -1, -1, 0}}, {{false, 8, -1, 2}}, {{true, -1, -1, 0}, true}, {{false, 4, 4, 0}, false, 2.5}};
  for (const MaskCase& m : varlen_masks) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      Spec s = with_mask(shape(1, 0, 0, 6, 2, 64, t), m);
      s.varlen_q = {5, 0, 1, 17, 33, 1, 0, 9};
      s.varlen_k = {5, 3, 1, 17, 64, 0, 0, 4};
      s.extra_rows = 3;
      add("varlen", s);
    }
  }
  for (DType t : {DType::f32, DType::bf16}) {
    Spec s = shape(1, 0, 0, 4, 2, 40, t);
    s.mask.causal = true;
    s.varlen_q = {3, 1, 20};
    s.varlen_k = {7, 1, 11};
    s.extra_rows = 2;
    s.in_layout = Layout::heads_major, s.out_layout = Layout::padded, s.lse = LseMode::transposed;
    add("varlen", s);
    s.in_layout = Layout::packed_qkv, s.out_layout = Layout::seq_first, s.lse = LseMode::contiguous;
    add("varlen", s);
  }
  {
    Spec big = shape(1, 0, 0, 1, 1, 64);
    big.mask.causal = true;
    big.varlen_q = {1000, 1, 25};
    big.varlen_k = {1025, 1, 40};
    add("varlen", big);
    Spec empty_q = shape(1, 0, 0, 2, 1, 32);  // no query rows at all: nothing may be written
    empty_q.varlen_q = {0, 0};
    empty_q.varlen_k = {3, 0};
    empty_q.extra_rows = 2;
    add("varlen", empty_q);
    Spec single = shape(1, 0, 0, 3, 3, 96, DType::f16);
    single.varlen_q = {64};
    single.varlen_k = {64};
    single.mask.causal = true;
    add("varlen", single);
  }

  // Degenerate sizes: no query rows, no keys (every row fully masked), empty batch.
  for (DType t : {DType::f32, DType::bf16}) {
    add("empty", shape(2, 0, 5, 4, 2, 32, t));
    add("empty", shape(2, 5, 0, 4, 2, 32, t));
    Spec sinks = shape(2, 5, 0, 4, 2, 32, t);
    sinks.sink_logits = true;
    add("empty", sinks);
    add("empty", shape(0, 4, 4, 4, 2, 32, t));
  }
  return cases;
}

void PrintTo(const GridCase& c, std::ostream* os) { *os << c.name; }

const std::vector<GridCase>& grid() {
  static const std::vector<GridCase> cases = build_grid();
  return cases;
}

class BackendGrid : public ::testing::TestWithParam<std::tuple<Backend, GridCase>> {};

TEST_P(BackendGrid, MatchesReference) {
  const auto& [backend, c] = GetParam();
  Problem p(c.spec, seed_of(c.name));
  const Snapshot before = snapshot(p);
  const Result64 ref = reference64(p);
  p.args.backend = backend;
  flashlite::forward(p.args);
  expect_matches(p, ref, before, Tolerance{});
}

INSTANTIATE_TEST_SUITE_P(Grid, BackendGrid, ::testing::Combine(::testing::Values(Backend::naive, Backend::cpu), ::testing::ValuesIn(grid())),
                         [](const ::testing::TestParamInfo<BackendGrid::ParamType>& info) {
                           return std::string(flashlite::backend_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

// The kernel Backend::cpu picks is the tiled one (its variant name says which SIMD path ran).
TEST(BackendChoice, CpuRunsTheTiledKernel) {
  Problem p(shape(1, 3, 3, 2, 1, 64), 1);
  p.args.backend = Backend::cpu;
  const std::string name = flashlite::forward_kernel_name(p.args);
  EXPECT_EQ(name.rfind("cpu_tiled_", 0), 0u) << name;
  p.args.backend = Backend::automatic;
  EXPECT_EQ(flashlite::forward_kernel_name(p.args), name);
  p.args.backend = Backend::naive;
  EXPECT_EQ(flashlite::forward_kernel_name(p.args), "cpu_naive_three_step");
  EXPECT_EQ(flashlite::forward_workspace_bytes(p.args), 0u);
}

}  // namespace
}  // namespace fltest
