// The float64 reference, the oracle of every other test, checked against values worked out by hand and against
// properties attention must have (rows of P sum to one, key order does not matter, O is linear in V, ...).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "test_util.h"

namespace fltest {
namespace {

using std::exp;
using std::log;

constexpr double kTight = 1e-12;

Spec tiny(int64_t sq, int64_t sk, int64_t d) {
  Spec s;
  s.seq_q = sq;
  s.seq_k = sk;
  s.d = d;
  return s;
}

void set_row(const TensorView& t, int64_t row, std::initializer_list<float> values, int64_t b = 0, int64_t h = 0) {
  int64_t c = 0;
  for (float v : values) set4(t, b, row, h, c++, v);
}

double out_at(const Problem& p, const Result64& r, int64_t b, int64_t row, int64_t h, int64_t c) {
  const Spec& s = p.spec;
  return r.out[size_t(((b * s.rows_q() + row) * s.hq + h) * s.d + c)];
}
double lse_at(const Problem& p, const Result64& r, int64_t b, int64_t row, int64_t h) {
  const Spec& s = p.spec;
  return r.lse[size_t((b * s.hq + h) * s.rows_q() + row)];
}

// ---------------------------------------------------------------- worked by hand

TEST(ReferenceByHand, OneKeyGivesItsValue) {
  Problem p(tiny(1, 1, 2), 1);
  set_row(p.args.q, 0, {1, 2});
  set_row(p.args.k, 0, {3, 4});
  set_row(p.args.v, 0, {5, -6});
  const Result64 r = reference64(p);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), 5.0, kTight);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 1), -6.0, kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 0, 0), 11.0 / std::sqrt(2.0), kTight);  // q.k = 11, default scale 1/sqrt(2)
}

TEST(ReferenceByHand, TwoKeysSoftmax) {
  Spec s = tiny(1, 2, 2);
  s.scale = 1.0;
  Problem p(s, 2);
  set_row(p.args.q, 0, {1, 0.5});
  set_row(p.args.k, 0, {2, 0});   // score 2
  set_row(p.args.k, 1, {-1, 2});  // score 0
  set_row(p.args.v, 0, {1, 2});
  set_row(p.args.v, 1, {3, -1});
  const Result64 r = reference64(p);
  const double p0 = exp(2.0) / (exp(2.0) + 1), p1 = 1 / (exp(2.0) + 1);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), p0 * 1 + p1 * 3, kTight);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 1), p0 * 2 - p1 * 1, kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 0, 0), log(exp(2.0) + 1), kTight);
}

TEST(ReferenceByHand, Causal2x2) {
  Spec s = tiny(2, 2, 1);
  s.scale = 1.0;
  s.mask.causal = true;
  Problem p(s, 3);
  set_row(p.args.q, 0, {1});
  set_row(p.args.q, 1, {2});
  set_row(p.args.k, 0, {1});
  set_row(p.args.k, 1, {-1});
  set_row(p.args.v, 0, {10});
  set_row(p.args.v, 1, {20});
  const Result64 r = reference64(p);
  // Row 0 sees key 0 only (score 1); row 1 sees both (scores 2, -2).
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), 10.0, kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 0, 0), 1.0, kTight);
  EXPECT_NEAR(out_at(p, r, 0, 1, 0, 0), (10 * exp(2.0) + 20 * exp(-2.0)) / (exp(2.0) + exp(-2.0)), kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 1, 0), log(exp(2.0) + exp(-2.0)), kTight);
}

TEST(ReferenceByHand, CausalIsBottomRightAligned) {
  {  // seq_q 1 < seq_k 2: the single query is the last one and sees both keys.
    Spec s = tiny(1, 2, 1);
    s.scale = 1.0;
    s.mask.causal = true;
    Problem p(s, 4);
    set_row(p.args.q, 0, {2});
    set_row(p.args.k, 0, {1});
    set_row(p.args.k, 1, {-1});
    set_row(p.args.v, 0, {10});
    set_row(p.args.v, 1, {20});
    const Result64 r = reference64(p);
    EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), (10 * exp(2.0) + 20 * exp(-2.0)) / (exp(2.0) + exp(-2.0)), kTight);
  }
  {  // seq_q 2 > seq_k 1: row 0 sits before the first key and sees nothing (zeros, LSE -inf); row 1 sees key 0.
    Spec s = tiny(2, 1, 1);
    s.scale = 1.0;
    s.mask.causal = true;
    Problem p(s, 5);
    set_row(p.args.q, 0, {1});
    set_row(p.args.q, 1, {2});
    set_row(p.args.k, 0, {1});
    set_row(p.args.v, 0, {10});
    const Result64 r = reference64(p);
    EXPECT_EQ(out_at(p, r, 0, 0, 0, 0), 0.0);
    EXPECT_EQ(lse_at(p, r, 0, 0, 0), -kInf);
    EXPECT_NEAR(out_at(p, r, 0, 1, 0, 0), 10.0, kTight);
    EXPECT_NEAR(lse_at(p, r, 0, 1, 0), 2.0, kTight);
  }
}

TEST(ReferenceByHand, SinkLogitJoinsTheDenominatorOnly) {
  Spec s = tiny(2, 1, 1);
  s.scale = 1.0;
  s.mask.causal = true;  // row 0 sees no key: only the sink remains
  s.sink_logits = true;
  Problem p(s, 6);
  set_row(p.args.q, 0, {3});
  set_row(p.args.q, 1, {1});
  set_row(p.args.k, 0, {0.5});  // row 1 score 0.5
  set_row(p.args.v, 0, {4});
  store(DType::f32, p.sinkbuf.data(), 0, -0.25f);
  const Result64 r = reference64(p);
  EXPECT_NEAR(out_at(p, r, 0, 1, 0, 0), 4 * exp(0.5) / (exp(0.5) + exp(-0.25)), kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 1, 0), log(exp(0.5) + exp(-0.25)), kTight);
  EXPECT_EQ(out_at(p, r, 0, 0, 0, 0), 0.0);
  EXPECT_NEAR(lse_at(p, r, 0, 0, 0), -0.25, kTight);  // documented: LSE is the sink logit when no key is visible
}

TEST(ReferenceByHand, Softcap) {
  Spec s = tiny(1, 2, 1);
  s.scale = 1.0;
  s.softcap = 2.0;
  Problem p(s, 7);
  set_row(p.args.q, 0, {1});
  set_row(p.args.k, 0, {3});   // score 3 -> 2 tanh(1.5)
  set_row(p.args.k, 1, {-1});  // score -1 -> 2 tanh(-0.5)
  set_row(p.args.v, 0, {1});
  set_row(p.args.v, 1, {-2});
  const Result64 r = reference64(p);
  const double c0 = 2 * std::tanh(1.5), c1 = 2 * std::tanh(-0.5);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), (exp(c0) - 2 * exp(c1)) / (exp(c0) + exp(c1)), kTight);
  EXPECT_NEAR(lse_at(p, r, 0, 0, 0), log(exp(c0) + exp(c1)), kTight);
}

// Keys orthogonal to the query give equal scores, so the output is the mean of the visible values and the LSE is
// log(number of visible keys): the visible sets below are listed by hand from the documented semantics.
struct MaskTableCase {
  const char* name;
  int64_t sq, sk;
  MaskSpec mask;
  std::vector<std::set<int>> visible;  // per query row
};

TEST(ReferenceByHand, MaskTable) {
  const std::vector<MaskTableCase> cases = {
      {"window 1,0", 4, 4, {false, 1, 0, 0}, {{0}, {0, 1}, {1, 2}, {2, 3}}},
      {"window 1,0 + 1 sink", 4, 4, {false, 1, 0, 1}, {{0}, {0, 1}, {0, 1, 2}, {0, 2, 3}}},
      {"causal q2 k5", 2, 5, {true, -1, -1, 0}, {{0, 1, 2, 3}, {0, 1, 2, 3, 4}}},
      {"causal + window 1, q2 k5", 2, 5, {true, 1, -1, 0}, {{2, 3}, {3, 4}}},
      {"causal + window 1 + 2 sinks, q2 k5", 2, 5, {true, 1, -1, 2}, {{0, 1, 2, 3}, {0, 1, 3, 4}}},
      {"window 0,1", 3, 3, {false, 0, 1, 0}, {{0, 1}, {1, 2}, {2}}},
      {"causal q4 k2", 4, 2, {true, -1, -1, 0}, {{}, {}, {0}, {0, 1}}},
      {"causal q4 k2 + sinks (never past causal)", 4, 2, {true, -1, -1, 2}, {{}, {}, {0}, {0, 1}}},
      {"window -1,0 q3 k6", 3, 6, {false, -1, 0, 0}, {{0, 1, 2, 3}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5}}},
      {"window 2,-1 + 1 sink q1 k6", 1, 6, {false, 2, -1, 1}, {{0, 3, 4, 5}}},
      {"window 0,0 + 5 sinks q3 k3", 3, 3, {false, 0, 0, 5}, {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}},
  };
  for (const MaskTableCase& c : cases) {
    SCOPED_TRACE(c.name);
    Spec s = tiny(c.sq, c.sk, 2);
    s.mask = c.mask;
    Problem p(s, 8);
    for (int64_t i = 0; i < c.sq; ++i) set_row(p.args.q, i, {1.5f + float(i), 0});
    for (int64_t j = 0; j < c.sk; ++j) {
      set_row(p.args.k, j, {0, float(j + 1)});
      set_row(p.args.v, j, {float(j), float(j * j) - 3});
    }
    const Result64 r = reference64(p);
    for (int64_t i = 0; i < c.sq; ++i) {
      const std::set<int>& vis = c.visible[size_t(i)];
      double m0 = 0, m1 = 0;
      for (int j : vis) m0 += j, m1 += double(j * j) - 3;
      const double n = double(vis.size());
      EXPECT_NEAR(out_at(p, r, 0, i, 0, 0), vis.empty() ? 0.0 : m0 / n, kTight) << "row " << i;
      EXPECT_NEAR(out_at(p, r, 0, i, 0, 1), vis.empty() ? 0.0 : m1 / n, kTight) << "row " << i;
      if (vis.empty()) {
        EXPECT_EQ(lse_at(p, r, 0, i, 0), -kInf) << "row " << i;
      } else {
        EXPECT_NEAR(lse_at(p, r, 0, i, 0), log(n), kTight) << "row " << i;
      }
      for (int64_t j = 0; j < c.sk; ++j) EXPECT_EQ(doc_visible(c.mask, i, j, c.sq, c.sk), vis.count(int(j)) == 1);
    }
  }
}

TEST(ReferenceByHand, GqaHeadMapping) {
  Spec s = tiny(1, 1, 2);
  s.hq = 6;
  s.hkv = 2;  // q heads 0-2 read kv head 0, 3-5 read kv head 1
  s.scale = 1.0;
  Problem p(s, 9);
  for (int64_t h = 0; h < 6; ++h) set_row(p.args.q, 0, {float(h + 1), 1}, 0, h);
  set_row(p.args.k, 0, {1, 0}, 0, 0);
  set_row(p.args.k, 0, {0, 2}, 0, 1);
  set_row(p.args.v, 0, {7, 8}, 0, 0);
  set_row(p.args.v, 0, {-9, 10}, 0, 1);
  const Result64 r = reference64(p);
  for (int64_t h = 0; h < 6; ++h) {
    EXPECT_NEAR(out_at(p, r, 0, 0, h, 0), h < 3 ? 7.0 : -9.0, kTight) << "head " << h;
    EXPECT_NEAR(out_at(p, r, 0, 0, h, 1), h < 3 ? 8.0 : 10.0, kTight) << "head " << h;
    EXPECT_NEAR(lse_at(p, r, 0, 0, h), h < 3 ? double(h + 1) : 2.0, kTight) << "head " << h;
  }
}

TEST(ReferenceByHand, VarlenSequencesAreIndependent) {
  Spec s = tiny(0, 0, 2);
  s.varlen_q = {1, 2, 0};
  s.varlen_k = {1, 2, 3};
  s.extra_rows = 1;
  s.mask.causal = true;
  Problem p(s, 10);
  for (int64_t i = 0; i < 3; ++i) set_row(p.args.q, i, {1, 0});
  for (int64_t j = 0; j < 6; ++j) {
    set_row(p.args.k, j, {0, 1});  // all scores 0
    set_row(p.args.v, j, {float(10 * j), 1});
  }
  const Result64 r = reference64(p);
  EXPECT_NEAR(out_at(p, r, 0, 0, 0, 0), 0.0, kTight);     // sequence 0: its one key (tensor row 0)
  EXPECT_NEAR(out_at(p, r, 0, 1, 0, 0), 10.0, kTight);    // sequence 1 row 0: causal, key row 1 only
  EXPECT_NEAR(out_at(p, r, 0, 2, 0, 0), 15.0, kTight);    // sequence 1 row 1: key rows 1, 2
  EXPECT_NEAR(lse_at(p, r, 0, 2, 0), log(2.0), kTight);
  EXPECT_TRUE(std::isnan(out_at(p, r, 0, 3, 0, 0)));      // row 3 belongs to no sequence: not written
  EXPECT_TRUE(std::isnan(lse_at(p, r, 0, 3, 0)));
}

// ---------------------------------------------------------------- properties on random inputs

struct PropCase {
  const char* name;
  Spec spec;
};

std::vector<PropCase> property_cases() {
  std::vector<PropCase> cases;
  auto base = [](int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
    Spec s;
    s.batch = b, s.seq_q = sq, s.seq_k = sk, s.hq = hq, s.hkv = hkv, s.d = d;
    return s;
  };
  cases.push_back({"plain", base(2, 9, 13, 4, 2, 16)});
  Spec s = base(2, 13, 9, 6, 2, 8);
  s.mask = {true, -1, -1, 0};
  cases.push_back({"causal q>k", s});
  s = base(1, 12, 20, 3, 1, 8);
  s.mask = {true, 3, -1, 2};
  s.sink_logits = true;
  cases.push_back({"causal window sinks sink_logits", s});
  s = base(1, 15, 15, 2, 2, 8);
  s.mask = {false, 2, 1, 1};
  s.softcap = 1.5;
  s.scale = 0.9;
  cases.push_back({"window softcap scale", s});
  s = base(1, 10, 10, 2, 1, 8);
  s.input_std = 6;  // logits in the hundreds: needs the max subtraction
  s.scale = 1.0;
  cases.push_back({"large logits", s});
  s = base(1, 0, 0, 4, 2, 8);
  s.varlen_q = {3, 0, 1, 7};
  s.varlen_k = {5, 2, 0, 7};
  s.extra_rows = 2;
  s.mask = {true, 4, -1, 1};
  s.sink_logits = true;
  cases.push_back({"varlen", s});
  return cases;
}

TEST(ReferenceProperties, MatchesIndependentOracleAndLogSumExp) {
  for (const PropCase& c : property_cases()) {
    SCOPED_TRACE(c.name);
    Problem p(c.spec, seed_of(c.name));
    const Result64 ref = reference64(p), ora = oracle64(p);
    for (size_t i = 0; i < ref.out.size(); ++i) {
      if (std::isnan(ora.out[i])) {
        ASSERT_TRUE(std::isnan(ref.out[i])) << "element " << i << " belongs to no sequence but was written";
      } else {
        ASSERT_NEAR(ref.out[i], ora.out[i], 1e-11) << "element " << i;
      }
    }
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      if (std::isnan(ora.lse[i]) || std::isinf(ora.lse[i])) {
        ASSERT_TRUE(std::isnan(ref.lse[i]) == std::isnan(ora.lse[i]) && (std::isnan(ora.lse[i]) || ref.lse[i] == ora.lse[i]))
            << "lse " << i << ": " << ref.lse[i] << " vs " << ora.lse[i];
      } else {
        ASSERT_NEAR(ref.lse[i], ora.lse[i], 1e-11 * std::max(1.0, std::fabs(ora.lse[i]))) << "lse " << i;
      }
    }
  }
}

TEST(ReferenceProperties, RowsOfPSumToOne) {
  for (const PropCase& c : property_cases()) {
    SCOPED_TRACE(c.name);
    Problem p(c.spec, seed_of(c.name));
    const Spec& s = p.spec;
    for (const Seq& q : sequences_of(s))
      for (int64_t j = 0; j < q.sk; ++j)
        for (int64_t h = 0; h < s.hkv; ++h)
          for (int64_t k = 0; k < s.d; ++k) set4(p.args.v, q.b, q.k0 + j, h, k, 1.0f);
    const Result64 r = reference64(p);
    for (const Seq& q : sequences_of(s)) {
      for (int64_t i = 0; i < q.sq; ++i) {
        bool any = false;
        for (int64_t j = 0; j < q.sk; ++j) any = any || doc_visible(s.mask, i, j, q.sq, q.sk);
        for (int64_t h = 0; h < s.hq; ++h) {
          // With a sink logit the keys share 1 - P(sink) = 1 - exp(sink - lse).
          const double lse = lse_at(p, r, q.b, q.q0 + i, h);
          const double want = !any ? 0.0 : 1.0 - (s.sink_logits ? exp(p.sink_logit(h) - lse) : 0.0);
          for (int64_t k = 0; k < s.d; ++k) ASSERT_NEAR(out_at(p, r, q.b, q.q0 + i, h, k), want, kTight);
        }
      }
    }
  }
}

TEST(ReferenceProperties, PermutingKeysWithoutMaskChangesNothing) {
  for (bool extras : {false, true}) {
    Spec s;
    s.batch = 2, s.seq_q = 7, s.seq_k = 23, s.hq = 6, s.hkv = 2, s.d = 12;
    s.sink_logits = extras;
    s.softcap = extras ? 2.0 : 0.0;
    Problem p(s, 11 + extras);
    const Result64 before = reference64(p);
    std::vector<int64_t> perm(size_t(s.seq_k));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
    Problem permuted(s, 11 + extras);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t j = 0; j < s.seq_k; ++j)
        for (int64_t h = 0; h < s.hkv; ++h)
          for (int64_t c = 0; c < s.d; ++c) {
            set4(permuted.args.k, b, j, h, c, get4(p.args.k, b, perm[size_t(j)], h, c));
            set4(permuted.args.v, b, j, h, c, get4(p.args.v, b, perm[size_t(j)], h, c));
          }
    const Result64 after = reference64(permuted);
    for (size_t i = 0; i < before.out.size(); ++i) ASSERT_NEAR(before.out[i], after.out[i], kTight);
    for (size_t i = 0; i < before.lse.size(); ++i) ASSERT_NEAR(before.lse[i], after.lse[i], kTight);
  }
}

TEST(ReferenceProperties, ScalingVScalesO) {
  for (const PropCase& c : property_cases()) {
    SCOPED_TRACE(c.name);
    Problem p(c.spec, seed_of(c.name)), scaled(c.spec, seed_of(c.name));
    const Spec& s = p.spec;
    for (const Seq& q : sequences_of(s))
      for (int64_t j = 0; j < q.sk; ++j)
        for (int64_t h = 0; h < s.hkv; ++h)
          for (int64_t k = 0; k < s.d; ++k) set4(scaled.args.v, q.b, q.k0 + j, h, k, -4.0f * get4(p.args.v, q.b, q.k0 + j, h, k));
    const Result64 a = reference64(p), b = reference64(scaled);
    for (size_t i = 0; i < a.out.size(); ++i) {
      if (!std::isnan(a.out[i])) {
        ASSERT_NEAR(b.out[i], -4.0 * a.out[i], kTight);
      }
    }
    for (size_t i = 0; i < a.lse.size(); ++i) {
      ASSERT_TRUE(a.lse[i] == b.lse[i] || (std::isnan(a.lse[i]) && std::isnan(b.lse[i])));  // V plays no part in LSE
    }
  }
}

TEST(ReferenceProperties, SinkLogitMinusInfChangesNothing) {
  for (const PropCase& c : property_cases()) {
    SCOPED_TRACE(c.name);
    Spec with = c.spec, without = c.spec;
    with.sink_logits = true;
    without.sink_logits = false;
    Problem a(with, 12), b(without, 12);
    for (int64_t h = 0; h < with.hq; ++h) store(DType::f32, a.sinkbuf.data(), h, -std::numeric_limits<float>::infinity());
    const Result64 ra = reference64(a), rb = reference64(b);
    for (size_t i = 0; i < ra.out.size(); ++i) ASSERT_TRUE(ra.out[i] == rb.out[i] || (std::isnan(ra.out[i]) && std::isnan(rb.out[i])));
    for (size_t i = 0; i < ra.lse.size(); ++i) ASSERT_TRUE(ra.lse[i] == rb.lse[i] || (std::isnan(ra.lse[i]) && std::isnan(rb.lse[i])));
  }
}

TEST(ReferenceProperties, CausalEqualsWindowRightZero) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{9, 9}, {5, 12}, {12, 5}}) {
    Spec causal;
    causal.batch = 2, causal.seq_q = sq, causal.seq_k = sk, causal.hq = 2, causal.hkv = 1, causal.d = 8;
    causal.mask = {true, -1, -1, 0};
    Spec window = causal;
    window.mask = {false, -1, 0, 0};
    Problem a(causal, 13), b(window, 13);
    const Result64 ra = reference64(a), rb = reference64(b);
    EXPECT_EQ(ra.out, rb.out);
    EXPECT_EQ(ra.lse, rb.lse);
  }
}

TEST(ReferenceProperties, ScaleOptionMultipliesTheScores) {
  Spec s;
  s.batch = 1, s.seq_q = 6, s.seq_k = 11, s.hq = 2, s.hkv = 2, s.d = 8;
  s.scale = 0.5;
  Spec unit = s;
  unit.scale = 1.0;
  Problem a(s, 14), b(unit, 14);
  for (int64_t i = 0; i < s.seq_q; ++i)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t c = 0; c < s.d; ++c) set4(b.args.q, 0, i, h, c, 0.5f * get4(a.args.q, 0, i, h, c));  // exact
  const Result64 ra = reference64(a), rb = reference64(b);
  for (size_t i = 0; i < ra.out.size(); ++i) ASSERT_NEAR(ra.out[i], rb.out[i], kTight);
  for (size_t i = 0; i < ra.lse.size(); ++i) ASSERT_NEAR(ra.lse[i], rb.lse[i], kTight);
}

// forward(Backend::reference) stores the float64 result rounded to the output dtype, and LSE rounded to fp32.
TEST(ReferenceProperties, ReferenceBackendStoresTheRoundedOracle) {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    Spec s = property_cases()[2].spec;
    s.dtype = t;
    s.out_layout = Layout::padded;
    Problem p(s, 15);
    const Result64 r = reference64(p);
    p.args.backend = Backend::reference;
    flashlite::forward(p.args);
    for (const Seq& q : sequences_of(s))
      for (int64_t i = 0; i < q.sq; ++i)
        for (int64_t h = 0; h < s.hq; ++h) {
          for (int64_t c = 0; c < s.d; ++c) {
            Buffer one(t, 1);
            store(t, one.data(), 0, float(out_at(p, r, q.b, i, h, c)));
            ASSERT_EQ(get4(p.args.out, q.b, i, h, c), load(t, one.data(), 0));
          }
          const float* lse = static_cast<const float*>(p.args.lse.data);
          ASSERT_EQ(lse[q.b * p.args.lse.strides[0] + h * p.args.lse.strides[1] + i * p.args.lse.strides[2]],
                    float(lse_at(p, r, q.b, i, h)));
        }
  }
}

}  // namespace
}  // namespace fltest
