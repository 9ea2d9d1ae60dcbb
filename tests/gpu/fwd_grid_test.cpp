// The fused CUDA forward kernel (backend 'cuda') against the float64 reference over a designed grid: sequence
// lengths (1, 17, 128, 1000, 4097, q_len != k_len both ways, empty keys), head_dim 32/64/96/128/256, GQA 1/4/8/3,
// every mask and combination (causal bottom-right, windows, sink tokens, sink logits, softcap), fp32/fp16/bf16,
// strided / unaligned / packed layouts, varlen with empty and length-1 sequences (inline and device offset tables),
// LSE layouts. Outputs are NaN-poisoned; every byte outside the computed elements must stay as it was.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_util.h"

namespace fltest {
namespace {

std::vector<Case> all_cases() {
  std::vector<Case> out;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  auto add = [&](std::string name, const Spec& s) { out.push_back({std::move(name), s}); };

  // Shapes: q_len == k_len, q_len != k_len both ways, empty keys; head_dim 64 and 128; causal and not.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},      {17, 17},   {128, 128}, {1000, 1000},
                                                {17, 1000},  {1000, 17}, {128, 300}, {5, 0}};
  for (DType t : dtypes)
    for (int64_t d : {64, 128})
      for (auto [sq, sk] : shapes)
        for (bool causal : {false, true}) {
          Spec s = base(t, d, sq, sk, 4, 2);
          s.mask.causal = causal;
          if (sq >= 1000 || sk >= 1000) s.batch = 1;
          add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_q" + std::to_string(sq) + "_k" +
                  std::to_string(sk) + (causal ? "_causal" : "_full"),
              s);
        }

  // Long sequences, one head.
  for (DType t : dtypes)
    for (bool causal : {false, true}) {
      Spec s = base(t, 64, 4097, 4097, 1, 1);
      s.batch = 1;
      s.mask.causal = causal;
      add(std::string(dt_name(t)) + "_d64_q4097" + (causal ? "_causal" : "_full"), s);
    }
  {
    Spec s = base(DType::bf16, 128, 4097, 4097, 1, 1);
    s.batch = 1;
    s.mask = {true, 1000, -1, 4};
    add("bf16_d128_q4097_causal_win1000_sinks4", s);
  }

  // GQA ratios 1, 4, 8 and a non-power-of-two (3), and MQA.
  for (DType t : {DType::f32, DType::bf16})
    for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 1}, {8, 1}, {6, 2}, {8, 8}, {16, 2}}) {
      Spec s = base(t, 64, 150, 220, hq, hkv);
      s.mask.causal = true;
      add(std::string(dt_name(t)) + "_gqa" + std::to_string(hq) + "x" + std::to_string(hkv), s);
    }

  // Every mask, q_len < k_len and q_len > k_len (the latter has fully masked rows under causal masks).
  for (DType t : dtypes)
    for (int64_t d : {64, 128})
      for (const MaskCase& m : mask_cases())
        for (auto [sq, sk] : std::vector<std::pair<int64_t, int64_t>>{{257, 391}, {391, 257}}) {
          const Case c = mask_case(t, d, sq, sk, 2, 1, m);
          add(c.name, c.spec);
        }

  // The other head dims.
  for (DType t : dtypes)
    for (int64_t d : {32, 96, 256})
      for (const char* m : {"full", "causal", "win30_sinks2_softcap"}) {
        Spec s = base(t, d, 130, 200, 2, 1);
        if (std::string(m) == "causal") s.mask.causal = true;
        if (std::string(m) == "win30_sinks2_softcap") s.mask = {true, 30, -1, 2}, s.softcap = 10, s.sink_logits = true;
        add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_" + m, s);
      }

  // Layouts: padded (unaligned base and strides: the scalar load/store path), head-major, seq-first, packed qkv;
  // outputs padded; LSE transposed or absent.
  const Layout layouts[] = {Layout::padded, Layout::heads_major, Layout::seq_first, Layout::packed_qkv};
  for (DType t : dtypes)
    for (Layout l : layouts)
      for (int64_t d : {64, 128}) {
        Spec s = base(t, d, 140, 140, 4, 2);
        s.mask.causal = true;
        s.in_layout = l;
        s.out_layout = l == Layout::packed_qkv ? Layout::padded : l;
        s.lse = l == Layout::padded ? LseMode::transposed : l == Layout::seq_first ? LseMode::none : LseMode::contiguous;
        add(std::string(dt_name(t)) + "_d" + std::to_string(d) + "_layout_" + layout_name(l), s);
      }
  for (DType t : {DType::f16, DType::bf16}) {  // aligned inputs, unaligned output (16-byte loads, scalar stores)
    Spec s = base(t, 128, 100, 100, 2, 2);
    s.out_layout = Layout::padded;
    add(std::string(dt_name(t)) + "_d128_out_padded", s);
  }

  // Varlen: empty and length-1 sequences, q_len != k_len per sequence, rows past the last sequence.
  for (DType t : dtypes)
    for (const char* m : {"full", "causal", "causal_win20_sinks3"}) {
      Spec s = base(t, 64, 0, 0, 4, 2);
      s.varlen_q = {0, 1, 17, 128, 300, 5, 64};
      s.varlen_k = {3, 1, 40, 128, 200, 0, 64};
      s.extra_rows = 5;
      if (std::string(m) == "causal") s.mask.causal = true;
      if (std::string(m) == "causal_win20_sinks3") s.mask = {true, 20, -1, 3}, s.sink_logits = true;
      add(std::string(dt_name(t)) + "_varlen_" + m, s);
    }
  for (DType t : {DType::f32, DType::bf16}) {  // more sequences than the inline table holds: device offsets
    Spec s = base(t, 128, 0, 0, 2, 1);
    for (int i = 0; i < 150; ++i) {
      s.varlen_q.push_back((i * 37) % 41);
      s.varlen_k.push_back((i * 53) % 47 + (i % 5 == 0 ? 0 : 1));
    }
    s.mask.causal = true;
    add(std::string(dt_name(t)) + "_varlen150_causal", s);
  }

  for (DType t : dtypes) {
    add_numeric_edge_cases(t, add);
  }
  return out;
}

class FusedGrid : public ::testing::TestWithParam<Case> {};

TEST_P(FusedGrid, MatchesFloat64Reference) {
  FL_SKIP_WITHOUT_GPU();
  run_and_check(GetParam().spec, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(Cuda, FusedGrid, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace fltest
