// The Hopper forward kernel (src/cuda/fwd_hopper/: wgmma + TMA, warp-specialised, ping-pong consumers) against the
// float64 reference. With FLASHLITE_FWD_HOPPER unset or 1 (0: the device tests skip, hopper_skip.h), on an sm_90
// device every eligible call of this executable takes the Hopper kernel: each case first checks forward_kernel_name,
// then the numbers (NaN-poisoned outputs, LSE, untouched bytes; tests/cpu/test_util.h). Cases the kernel rejects must
// fall back to the mma.sync / fp32 kernels and still be right. The eligibility logic and the setting's parser are
// unit-tested without a device. Without a GPU, or on a GPU other than sm_90, or in a build without the 90a target, the
// device tests skip.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/problem.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/errors.h"
#include "gpu_util.h"
#include "hopper_skip.h"

namespace fltest {
namespace {

namespace h = flashlite::cuda_fwd_hopper;

// Runs one problem on the GPU after checking which kernel forward() picks (prefix of forward_kernel_name).
void check_case(const Spec& spec, const std::string& name, const std::string& want_prefix) {
  Problem p(spec, seed_of(name));
  const Result64 ref = reference64(p);
  const Snapshot before = snapshot(p);
  DeviceMirror m(p);
  const std::string kernel = fltest::suite_forward_kernel_name(m.args);
  ASSERT_EQ(kernel.rfind(want_prefix, 0), 0u) << "picked " << kernel << ", expected " << want_prefix << "...";
  fltest::suite_forward(m.args);
  m.copy_back();
  expect_matches(p, ref, before, gpu_tolerance(spec.dtype));
}

std::vector<Case> hopper_cases() {
  std::vector<Case> out;
  auto add = [&](std::string name, const Spec& s) { out.push_back({std::move(name), s}); };
  // Shapes: odd lengths around the 128-row / 128-key tiles, q_len != k_len both ways; GQA 4 (8 q heads, 2 kv heads).
  // 256 x 256: whole tiles only (no key past the end, no partial query tile: every tile unmasked when not causal).
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},       {17, 17},   {127, 127}, {129, 129}, {256, 256},
                                                {1000, 1000}, {17, 1000}, {1000, 17}, {129, 300}};
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (auto [sq, sk] : shapes)
        for (bool causal : {false, true}) {
          Spec s = base(t, d, sq, sk, 8, 2);
          s.mask.causal = causal;
          if (sq >= 1000 || sk >= 1000) s.batch = 1, s.hq = 4, s.hkv = 1;  // GQA 4 still; the reference is slow
          add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_q" + std::to_string(sq) + "_k" +
                  std::to_string(sk) + (causal ? "_causal" : "_full"),
              s);
        }
  // MQA and no grouping.
  for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {3, 3}}) {
    Spec s = base(DType::bf16, 128, 150, 220, hq, hkv);
    s.mask.causal = true;
    add("bf16_d128_gqa" + std::to_string(hq) + "x" + std::to_string(hkv), s);
  }
  // Masks beyond causal: windows, sink tokens, learned sink logits, softcap (fully masked rows when q_len > k_len).
  const std::string hopper_masks = " winleft50 win50x30 causal_win64 causal_win100_sinks3 win8x8_sinks2000 "
                                   "causal_sinklogits softcap causal_win70_sinks2_softcap ";
  for (auto [t, d] : std::vector<std::pair<DType, int64_t>>{{DType::bf16, 128}, {DType::f16, 64}})
    for (const MaskCase& m : mask_cases()) {
      if (hopper_masks.find(std::string(" ") + m.name + " ") == std::string::npos) continue;
      for (auto [sq, sk] : std::vector<std::pair<int64_t, int64_t>>{{257, 391}, {391, 257}}) {
        const Case c = mask_case(t, d, sq, sk, 4, 1, m);
        add(c.name, c.spec);
      }
    }
  // More work tiles than an H100's 132 SMs, so each persistent CTA walks several: 4 x 12 heads x 3 (D64 full and
  // softcap: 192-row tiles) or 5 (128-row tiles) query tiles (GQA 3) under each kind of mask; and causal with
  // q_len > k_len, where 7 of each head's 8 query tiles see no key at all.
  for (auto [t, d] : std::vector<std::pair<DType, int64_t>>{{DType::bf16, 64}, {DType::f16, 128}})
    for (int m = 0; m < 4; ++m) {
      Spec s = base(t, d, 520, 520, 12, 4);
      s.batch = 4;
      if (m == 1) s.mask.causal = true;
      if (m == 2) s.mask = {true, 100, -1, 3}, s.sink_logits = true;
      if (m == 3) s.softcap = 20;
      const char* mask = m == 0 ? "full" : m == 1 ? "causal" : m == 2 ? "causal_win100_sinks3_sinklogits" : "softcap";
      add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_b4_h12x4_q520_" + mask, s);
    }
  {
    Spec s = base(DType::bf16, 128, 1000, 17, 16, 4);
    s.batch = 2;
    s.mask.causal = true;
    add("bf16_d128_b2_h16x4_q1000_k17_causal", s);
  }
  // D64 masked rows past 4096 queries: the three-warpgroup kernel (192-row tiles; shorter masked rows take 128-row
  // ones) under causal, a window with sinks and learned sink logits, and varlen, with a partial last tile.
  for (int m = 0; m < 3; ++m) {
    Spec s = base(m == 1 ? DType::f16 : DType::bf16, 64, 4160, m == 1 ? 4300 : 4160, 2, 1);
    s.batch = 1;
    s.mask.causal = true;
    if (m == 1) s.mask = {true, 1000, -1, 4}, s.sink_logits = true;
    if (m == 2) s.varlen_q = {4150, 17, 1, 0}, s.varlen_k = {4150, 40, 1, 3};
    add(std::string(m == 1 ? "f16" : "bf16") + "_d64_q4160_" +
            (m == 0 ? "causal" : m == 1 ? "causal_win1000_sinks4_sinklogits" : "varlen_causal"), s);
  }
  // D128 rows of more than 2048 keys: the kernel with two P buffers (shorter ones take one), unmasked and varlen
  // causal.
  for (int m = 0; m < 2; ++m) {
    Spec s = base(m == 0 ? DType::f16 : DType::bf16, 128, 1000, 2300, 4, 1);
    s.batch = 1;
    if (m == 1) s.mask.causal = true, s.varlen_q = {2100, 5, 300}, s.varlen_k = {2200, 5, 300};
    add(m == 0 ? "f16_d128_q1000_k2300_full" : "bf16_d128_k2200_varlen_causal", s);
  }
  // A long causal window with sinks (many skipped tiles, sink tile first).
  {
    Spec s = base(DType::bf16, 128, 4097, 4097, 2, 1);
    s.batch = 1;
    s.mask = {true, 1000, -1, 4};
    add("bf16_d128_q4097_causal_win1000_sinks4", s);
  }
  // Varlen: empty and length-1 sequences, q_len != k_len per sequence, NaN rows past the last sequence; inline
  // offsets and the device table (> 128 sequences).
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        Spec s = base(t, d, 0, 0, 4, 2);
        s.varlen_q = {0, 1, 17, 128, 300, 5, 129};
        s.varlen_k = {3, 1, 40, 128, 200, 0, 129};
        s.extra_rows = 5;
        s.mask.causal = causal;
        add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_varlen" + (causal ? "_causal" : "_full"), s);
      }
  {
    Spec s = base(DType::bf16, 128, 0, 0, 2, 1);
    for (int i = 0; i < 150; ++i) {
      s.varlen_q.push_back((i * 37) % 141);
      s.varlen_k.push_back((i * 53) % 147 + 1);
    }
    s.mask.causal = true;
    add("bf16_d128_varlen150_causal", s);
  }
  // Layouts TMA accepts (aligned strides): heads-major, seq-first, packed qkv; LSE transposed or absent.
  for (Layout l : {Layout::heads_major, Layout::seq_first, Layout::packed_qkv}) {
    Spec s = base(DType::bf16, 128, 140, 140, 4, 2);
    s.mask.causal = true;
    s.in_layout = l;
    s.out_layout = l == Layout::packed_qkv ? Layout::contiguous : l;
    s.lse = l == Layout::seq_first ? LseMode::none : LseMode::transposed;
    add(std::string("bf16_d128_layout_") + layout_name(l), s);
  }
  // out rows 4-byte aligned but not 16: the epilogue's 4-byte stores instead of 16-byte ones; more tiles than SMs.
  for (bool causal : {false, true}) {
    Spec s = base(DType::bf16, 64, 700, 700, 8, 2);
    s.batch = 5;  // 5 x 8 heads x 4 query tiles of 192 rows (full) or 6 of 128 (causal)
    s.mask.causal = causal;
    s.out_layout = Layout::pair_padded;
    add(std::string("bf16_d64_b5_out_pairpadded") + (causal ? "_causal" : "_full"), s);
  }
  for (DType t : {DType::bf16, DType::f16}) {
    add_numeric_edge_cases(t, add);
  }
  return out;
}

class HopperGrid : public ::testing::TestWithParam<Case> {};

TEST_P(HopperGrid, MatchesFloat64Reference) {
  FL_SKIP_UNLESS_HOPPER();
  const Spec& s = GetParam().spec;
  check_case(s, GetParam().name, std::string("cuda_hopper_wgmma_") + dt_name(s.dtype) + "_d" + std::to_string(s.d));
}

INSTANTIATE_TEST_SUITE_P(Cuda, HopperGrid, ::testing::ValuesIn(hopper_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Problems the Hopper kernel rejects run on the kernels they ran on before, with the same results.
TEST(HopperFallback, RejectedProblemsTakeTheOtherKernels) {
  FL_SKIP_UNLESS_HOPPER();
  {
    Spec s = base(DType::f32, 64, 100, 100, 2, 1);
    s.mask.causal = true;
    check_case(s, "fallback_f32", "cuda_fused_simt_f32_");
  }
  for (int64_t d : {32, 96, 256}) {
    Spec s = base(DType::bf16, d, 130, 200, 2, 1);
    check_case(s, "fallback_d" + std::to_string(d), "cuda_fused_mma_bf16_");
  }
  {
    Spec s = base(DType::f16, 128, 140, 140, 4, 2);  // unaligned base and strides: no TMA
    s.in_layout = Layout::padded;
    check_case(s, "fallback_padded_in", "cuda_fused_mma_f16_");
  }
  {
    Spec s = base(DType::bf16, 64, 5, 0, 4, 2);  // no keys at all
    check_case(s, "fallback_empty_keys", "cuda_fused_mma_bf16_");
  }
}

// Twice in a row on the same buffers (poisoned in between): the per-device attribute setup and the tensor maps
// hold no state that a second call could trip on.
TEST(HopperFeatures, RepeatedCallsAgree) {
  FL_SKIP_UNLESS_HOPPER();
  Spec s = base(DType::bf16, 128, 700, 900, 8, 2);
  s.mask.causal = true;
  Problem p(s, seed_of("repeat"));
  const Result64 ref = reference64(p);
  const Snapshot before = snapshot(p);
  DeviceMirror m(p);
  for (int run = 0; run < 2; ++run) {
    m.poison_outputs(p);
    fltest::suite_forward(m.args);
    m.copy_back();
    expect_matches(p, ref, before, gpu_tolerance(s.dtype));
  }
}

// Varlen: the K/V tensor maps end at the last sequence's end, so a sequence's partial last key tile is filled with the
// next sequence's rows. Their keys are masked (a select: a non-finite score there is overwritten), and the consumers
// zero those V rows in shared memory before P V; without that, 0 x Inf = NaN in P V turned this sequence's output
// into NaN (the mma.sync kernel zero-fills such rows when it loads them). Non-finite K or V values (+inf, -inf, NaN)
// in the rows of the two sequences without queries, which only their predecessors' partial tiles can read:
//   sequence 0 (q 200, k 300): its third key tile (rows 256..383, keys past 44 masked) crosses into sequences 1
//     (poisoned) and 2; both query tiles visit it, the second only when causal;
//   sequence 2 (q 100, k 100): its only tile (rows 350..477) crosses into sequence 3 (poisoned), the last: rows past
//     the maps' end (extra NaN rows) are zero-filled by TMA itself.
// The V cases fail without the zeroing; the K cases would fail if the mask became an additive bias.
TEST(HopperFeatures, VarlenIgnoresNonFiniteValuesOfTheNextSequence) {
  FL_SKIP_UNLESS_HOPPER();
  constexpr float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  const float bad[3] = {kInf, -kInf, kNaN};
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (char poisoned : {'v', 'k'}) {
          const std::string name = std::string(dt_name(t)) + "_d" + std::to_string(d) + (causal ? "_causal" : "_full") +
                                   "_poisoned_" + poisoned;
          SCOPED_TRACE(name);
          Spec s = base(t, d, 0, 0, 4, 2);
          s.varlen_q = {200, 0, 100, 0};
          s.varlen_k = {300, 50, 100, 60};
          s.extra_rows = 3;
          s.mask.causal = causal;
          Problem p(s, seed_of("varlen_next_nonfinite_" + name));
          const flashlite::TensorView& target = poisoned == 'v' ? p.args.v : p.args.k;
          for (auto [r0, r1] : {std::pair<int64_t, int64_t>{300, 350}, std::pair<int64_t, int64_t>{450, 510}})
            for (int64_t row = r0; row < r1; ++row)
              for (int64_t h = 0; h < s.hkv; ++h)
                for (int64_t c = 0; c < s.d; ++c) set4(target, 0, row, h, c, bad[(row + c) % 3]);
          const Result64 ref = reference64(p);
          const Snapshot before = snapshot(p);
          DeviceMirror m(p);
          ASSERT_EQ(flashlite::forward_kernel_name(m.args).rfind("cuda_hopper_wgmma_", 0), 0u)
              << "picked " << flashlite::forward_kernel_name(m.args);
          fltest::suite_forward(m.args);
          m.copy_back();
          expect_matches(p, ref, before, gpu_tolerance(s.dtype));
        }
}

// ---------------------------------------------------------------- eligibility logic (no device needed)

flashlite::AttentionProblem aligned_problem(DType t, int64_t d) {
  flashlite::AttentionProblem p;
  p.dtype = t;
  p.batch = 2;
  p.seq_q = p.seq_k = p.q_tensor_rows = 300;
  p.q_heads = 8;
  p.kv_heads = 2;
  p.head_dim = d;
  alignas(16) static unsigned char buf[64];
  p.q = p.k = p.v = buf;
  p.out = buf;
  p.q_stride = p.out_stride = {300 * 8 * d, 8 * d, d};
  p.k_stride = p.v_stride = {300 * 2 * d, 2 * d, d};
  return p;
}

TEST(HopperEligibility, AcceptsAlignedHalfPrecisionD64AndD128OnSm90) {
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128}) EXPECT_EQ(h::hopper_fwd_reject_reason(aligned_problem(t, d), 90), "");
}

TEST(HopperEligibility, RejectsOtherDevicesDtypesAndHeadDims) {
  EXPECT_NE(h::hopper_fwd_reject_reason(aligned_problem(DType::bf16, 128), 80), "");
  EXPECT_NE(h::hopper_fwd_reject_reason(aligned_problem(DType::bf16, 128), 100), "");
  EXPECT_NE(h::hopper_fwd_reject_reason(aligned_problem(DType::f32, 128), 90), "");
  for (int64_t d : {32, 96, 256}) EXPECT_NE(h::hopper_fwd_reject_reason(aligned_problem(DType::bf16, d), 90), "");
}

TEST(HopperEligibility, RejectsWhatTmaCannotAddress) {
  auto p = aligned_problem(DType::bf16, 128);
  p.k_stride.seq += 1;  // a row stride that is not a 16-byte multiple
  EXPECT_NE(h::hopper_fwd_reject_reason(p, 90), "");
  p = aligned_problem(DType::bf16, 128);
  p.q = static_cast<const unsigned char*>(p.q) + 2;  // base off 16-byte alignment
  EXPECT_NE(h::hopper_fwd_reject_reason(p, 90), "");
  p = aligned_problem(DType::bf16, 128);
  p.out = static_cast<unsigned char*>(p.out) + 2;  // 2-byte aligned output: no paired stores
  EXPECT_NE(h::hopper_fwd_reject_reason(p, 90), "");
  p = aligned_problem(DType::bf16, 128);
  p.seq_k = 0;  // no keys: the tensor map would be empty
  EXPECT_NE(h::hopper_fwd_reject_reason(p, 90), "");
  p = aligned_problem(DType::bf16, 128);
  p.batch = 1;
  p.v_stride.batch = 3;  // a batch stride that never steps does not matter
  EXPECT_EQ(h::hopper_fwd_reject_reason(p, 90), "");
}

TEST(HopperEligibility, VarlenUsesTheLastSequenceEnd) {
  auto p = aligned_problem(DType::f16, 64);
  static const int32_t cu_q[] = {0, 10, 10, 300}, cu_k[] = {0, 0, 5, 9};
  p.batch = 3;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  EXPECT_EQ(h::hopper_fwd_reject_reason(p, 90), "");
  static const int32_t cu_k0[] = {0, 0, 0, 0};
  p.cu_seqlens_k = cu_k0;  // no key anywhere
  EXPECT_NE(h::hopper_fwd_reject_reason(p, 90), "");
}

TEST(HopperEligibility, SettingValues) {  // FLASHLITE_FWD_HOPPER, parsed strictly
  EXPECT_TRUE(h::parse_fwd_hopper_setting(nullptr));
  EXPECT_TRUE(h::parse_fwd_hopper_setting(""));
  EXPECT_TRUE(h::parse_fwd_hopper_setting("1"));
  EXPECT_FALSE(h::parse_fwd_hopper_setting("0"));
  for (const char* bad : {"2", "3", "-1", "on", "off", "true", "2x", " 0"}) {
    try {
      (void)h::parse_fwd_hopper_setting(bad);
      ADD_FAILURE() << "accepted FLASHLITE_FWD_HOPPER=" << bad;
    } catch (const flashlite::Error& e) {
      EXPECT_EQ(e.kind(), flashlite::ErrorKind::invalid_value);
      EXPECT_NE(std::string(e.what()).find("FLASHLITE_FWD_HOPPER"), std::string::npos) << e.what();
    }
  }
}

TEST(HopperEligibility, NameAndShape) {
  flashlite::AttentionProblem p = aligned_problem(DType::bf16, 128);
  EXPECT_EQ(h::hopper_fwd_kernel_name(p, h::hopper_shape(p)), "cuda_hopper_wgmma_bf16_d128_128x128_p1_pingpong");
  const auto shape = [&] { return std::make_pair(h::hopper_shape(p).block_rows, h::hopper_shape(p).p_buffers); };
  // D128: one P buffer up to 2048 keys, two beyond.
  p.seq_k = 2049;
  EXPECT_EQ(shape(), std::make_pair(128, 2));
  // D64: three consumer warpgroups (192 rows) with one P buffer, unless the rows are masked (causal or windowed) and
  // at most 4096: then two warpgroups with two buffers.
  p = aligned_problem(DType::f16, 64);
  EXPECT_EQ(h::hopper_fwd_kernel_name(p, h::hopper_shape(p)), "cuda_hopper_wgmma_f16_d64_192x128_p1_pingpong");
  p.mask.causal = true;
  EXPECT_EQ(shape(), std::make_pair(128, 2));
  p.seq_q = 4097;
  EXPECT_EQ(shape(), std::make_pair(192, 1));
  p.mask.causal = false;
  p.mask.window_left = 100;
  p.seq_q = 4096;
  EXPECT_EQ(shape(), std::make_pair(128, 2));
}

}  // namespace
}  // namespace fltest
