// The backward pass on the CPU backends:
//   1. the float64 reference against central finite differences of the float64 forward (every mask kind, sink
//      logits, softcap, GQA, varlen, q_len != k_len both ways): the oracle itself is checked;
//   2. the cpu backend against the reference over a grid (sequence lengths around the 64-row tile, head dims, GQA
//      1/2/4/8 and 6/2, every mask and their combinations, rows without keys, strided layouts, varlen with empty and
//      length-1 sequences; fp32 / fp16 / bf16), gradients poisoned before the call (padding must stay NaN);
//   3. determinism (bitwise, across thread counts and both schedules) and argument validation (named errors, nothing
//      written).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backward_util.h"
#include "flashlite/backward.h"
#include "test_util.h"

namespace fltest {
namespace {

using flashlite::BackwardArgs;

// A problem's forward (out, lse by the cpu backend), a random dout and poisoned gradient buffers.
struct Grad {
  Problem p;
  Buffer dout, dq, dk, dv, dsink, dlse;
  BackwardArgs args;

  // with_dlse: a random gradient for lse too (the loss depends on both outputs).
  Grad(const Spec& s, const std::string& name, bool with_dlse = false) : p(s, seed_of(name)) {
    ForwardArgs f = p.args;
    f.backend = Backend::cpu;
    flashlite::forward(f);
    const int64_t B = s.tensor_batch(), RQ = s.rows_q(), RK = s.rows_k(), D = s.d;
    args.q = p.args.q, args.k = p.args.k, args.v = p.args.v, args.out = p.args.out, args.lse = p.args.lse;
    args.options = p.args.options;
    args.dout = make(dout, s.out_layout, {B, RQ, s.hq, D});
    std::mt19937_64 rng(seed_of(name + " dout"));
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < RQ; ++r)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t c = 0; c < D; ++c) set4(args.dout, b, r, h, c, normal(rng));
    args.dq = make(dq, s.out_layout, {B, RQ, s.hq, D});
    args.dk = make(dk, s.out_layout, {B, RK, s.hkv, D});
    args.dv = make(dv, s.out_layout, {B, RK, s.hkv, D});
    if (s.sink_logits) {
      dsink = Buffer(DType::f32, s.hq);
      dsink.poison();
      args.dsink_logits = view_n(dsink.data(), DType::f32, {s.hq}, {1});
    }
    if (with_dlse) {
      dlse = Buffer(DType::f32, B * s.hq * RQ);
      for (int64_t i = 0; i < dlse.numel(); ++i) store(DType::f32, dlse.data(), i, normal(rng));
      args.dlse = view_n(dlse.data(), DType::f32, {B, s.hq, RQ}, {s.hq * RQ, RQ, 1});
    }
  }
  TensorView make(Buffer& buf, Layout l, std::array<int64_t, 4> shape) {
    const Placement pl = place(l, shape);
    buf = Buffer(p.spec.dtype, pl.numel);
    buf.poison();
    return view4(buf, pl.offset, shape, pl.strides);
  }
};

using Ref = Grads64;

Ref reference(const Grad& g) { return reference_grads(g.p.spec, g.args); }

// Every element of view t against want ([b, rows, heads, d] contiguous) within tol * max(1, max |want|).
void expect_close(const char* name, const TensorView& t, const std::vector<double>& want, double tol) {
  const double bound = tol * std::max(1.0, max_abs(want));
  int bad = 0;
  double worst = 0;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t r = 0; r < t.shape[1]; ++r)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t c = 0; c < t.shape[3]; ++c) {
          const double w = want[size_t(((b * t.shape[1] + r) * t.shape[2] + h) * t.shape[3] + c)];
          const double got = get4(t, b, r, h, c);
          const double err = std::fabs(got - w);
          if (!(err <= bound)) {
            if (bad++ < 5) {
              ADD_FAILURE() << name << "[" << b << "," << r << "," << h << "," << c << "] = " << got << ", reference "
                            << w << " (bound " << bound << ")";
            }
          }
          if (std::isfinite(err)) worst = std::max(worst, err);
        }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " elements off; worst finite error " << worst;
}

double tolerance(DType t) { return t == DType::f32 ? 1e-4 : t == DType::f16 ? 4e-3 : 3e-2; }

// ---------------------------------------------------------------- 1. the reference against finite differences

struct FdCase {
  std::string name;
  Spec spec;
  bool dlse = false;  // the loss depends on lse too
};

std::vector<FdCase> fd_cases() {
  const auto shape = [](int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
    Spec s;
    s.seq_q = sq, s.seq_k = sk, s.hq = hq, s.hkv = hkv, s.d = d;
    return s;
  };
  std::vector<FdCase> cs;
  cs.push_back({"full", shape(5, 7, 2, 1, 4)});
  Spec c = shape(7, 5, 4, 2, 4);
  c.mask.causal = true;  // q_len > k_len: the first rows see no key
  cs.push_back({"causal_morequeries", c});
  Spec w = shape(6, 9, 2, 2, 4);
  w.mask = {true, 2, -1, 1};
  w.sink_logits = true;
  cs.push_back({"window_sinktoken_sinklogits", w});
  Spec wr = shape(6, 6, 3, 1, 4);
  wr.mask = {false, 1, 2, 0};
  wr.softcap = 2.0;
  wr.input_std = 2.0;  // the cap bites
  cs.push_back({"window_both_softcap", wr});
  Spec v = shape(0, 0, 2, 1, 4);
  v.varlen_q = {3, 0, 1, 4};
  v.varlen_k = {5, 2, 1, 3};
  v.mask.causal = true;
  v.sink_logits = true;
  v.extra_rows = 2;
  cs.push_back({"varlen_causal_sinklogits", v});
  Spec b = shape(4, 6, 2, 2, 4);
  b.batch = 2;
  b.scale = 0.7;
  cs.push_back({"batch2_scale", b});
  cs.push_back({"window_sinklogits_dlse", w, true});
  cs.push_back({"varlen_dlse", v, true});
  return cs;
}

class ReferenceFiniteDifferences : public ::testing::TestWithParam<int> {};

// loss(x) = sum(dout * out(x)) in float64; its derivative along each stored input element, by a central difference
// over the values the element actually takes (x + h and x - h rounded to fp32), against the reference's gradient.
TEST_P(ReferenceFiniteDifferences, GradientsMatch) {
  const FdCase c = fd_cases()[size_t(GetParam())];
  Grad g(c.spec, "fd " + c.name, c.dlse);
  const Spec& s = c.spec;
  const Ref ref = reference(g);
  std::vector<double> out(size_t(s.tensor_batch() * s.rows_q() * s.hq * s.d));
  std::vector<double> lse(size_t(s.tensor_batch() * s.hq * s.rows_q()));
  const auto loss = [&] {
    flashlite::reference_forward_f64(g.p.args, out.data(), lse.data());
    double sum = 0;
    if (c.dlse) {
      for (int64_t b = 0; b < s.tensor_batch(); ++b)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t r = 0; r < s.rows_q(); ++r) {
            const double l = lse[size_t((b * s.hq + h) * s.rows_q() + r)];
            if (std::isfinite(l)) sum += l * load(DType::f32, g.dlse.data(), (b * s.hq + h) * s.rows_q() + r);
          }
    }
    for (int64_t b = 0; b < s.tensor_batch(); ++b)
      for (int64_t r = 0; r < s.rows_q(); ++r)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t e = 0; e < s.d; ++e) {
            const double o = out[size_t(((b * s.rows_q() + r) * s.hq + h) * s.d + e)];
            if (!std::isnan(o)) sum += o * get4(g.args.dout, b, r, h, e);  // NaN: rows outside every sequence
          }
    return sum;
  };
  const double h = 1.0 / 128;
  // The derivative with respect to the element at index i of (base, dtype f32), and what the reference says.
  const auto check = [&](const char* what, void* base, int64_t i, double want, double scale) {
    const float x = load(DType::f32, base, i);
    store(DType::f32, base, i, float(x + h));
    const double up = loss(), xu = load(DType::f32, base, i);
    store(DType::f32, base, i, float(x - h));
    const double down = loss(), xd = load(DType::f32, base, i);
    store(DType::f32, base, i, x);
    const double fd = (up - down) / (xu - xd);
    EXPECT_NEAR(fd, want, 2e-4 * std::max(1.0, scale)) << what << " element " << i;
  };
  for (auto [t, r, name] : {std::tuple{&g.args.q, &ref.dq, "dq"}, {&g.args.k, &ref.dk, "dk"}, {&g.args.v, &ref.dv, "dv"}}) {
    const double scale = max_abs(*r);
    EXPECT_GT(scale, 1e-3) << name << " is all zero: the case tests nothing";
    for (int64_t b = 0; b < t->shape[0]; ++b)
      for (int64_t row = 0; row < t->shape[1]; ++row)
        for (int64_t hh = 0; hh < t->shape[2]; ++hh)
          for (int64_t e = 0; e < t->shape[3]; ++e) {
            const int64_t off = offset4(*t, b, row, hh, e);
            if (std::isnan(load(DType::f32, t->data, off))) continue;  // varlen rows outside every sequence
            const double want = (*r)[size_t(((b * t->shape[1] + row) * t->shape[2] + hh) * t->shape[3] + e)];
            check(name, t->data, off, want, scale);
          }
  }
  if (s.sink_logits) {
    for (int64_t hh = 0; hh < s.hq; ++hh) {
      if (std::isinf(g.p.sink_logit(hh))) continue;  // -inf: no sink, no gradient to speak of
      check("dsink", g.p.sinkbuf.data(), hh, ref.dsink[size_t(hh)], max_abs(ref.dsink));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceFiniteDifferences, ::testing::Range(0, int(fd_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return fd_cases()[size_t(info.param)].name; });

// ---------------------------------------------------------------- 2. the cpu backend against the reference

struct GridCase {
  std::string name;
  Spec spec;
  bool dlse = false;
};

std::vector<GridCase> grid_cases() {
  std::vector<GridCase> cs;
  const auto add = [&](std::string name, Spec s, bool dlse = false) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      s.dtype = t;
      cs.push_back({name + "_" + (t == DType::f32 ? "f32" : t == DType::f16 ? "f16" : "bf16"), s, dlse});
    }
  };
  for (int64_t seq : {1, 2, 17, 64, 130}) {
    Spec s;
    s.seq_q = s.seq_k = seq, s.hq = 4, s.hkv = 2, s.d = 32;
    add("seq" + std::to_string(seq), s);
    s.mask.causal = true;
    add("seq" + std::to_string(seq) + "_causal", s);
  }
  Spec s;
  s.seq_q = 40, s.seq_k = 150, s.hq = 8, s.hkv = 1, s.d = 64, s.mask.causal = true;
  add("qshort_gqa8_causal", s);
  s = Spec{};
  s.seq_q = 150, s.seq_k = 40, s.hq = 6, s.hkv = 2, s.d = 64, s.mask.causal = true;  // the first 110 rows see no key
  s.sink_logits = true;
  add("qlong_gqa3_causal_sinklogits", s);
  s = Spec{};
  s.seq_q = s.seq_k = 200, s.hq = 4, s.hkv = 4, s.d = 128;
  s.mask = {true, 50, -1, 4};
  s.sink_logits = true;
  add("window_sinks_sinklogits_d128", s);
  s = Spec{};
  s.seq_q = s.seq_k = 100, s.hq = 2, s.hkv = 1, s.d = 80, s.batch = 2;
  s.mask = {false, 20, 10, 0};
  s.softcap = 5.0, s.input_std = 3.0;
  s.in_layout = Layout::padded, s.out_layout = Layout::padded;
  add("window_both_softcap_d80_padded", s);
  s = Spec{};
  s.seq_q = 70, s.seq_k = 90, s.hq = 4, s.hkv = 2, s.d = 64, s.batch = 3;
  s.in_layout = Layout::heads_major, s.out_layout = Layout::seq_first, s.lse = LseMode::transposed;
  add("strided_layouts", s);
  s = Spec{};
  s.hq = 4, s.hkv = 2, s.d = 64;
  s.varlen_q = {70, 0, 1, 33, 129};
  s.varlen_k = {80, 5, 1, 0, 129};
  s.extra_rows = 3;
  s.mask.causal = true;
  s.sink_logits = true;
  add("varlen_causal_sinklogits", s);
  add("varlen_causal_sinklogits_dlse", s, true);
  return cs;
}

class CpuBackwardGrid : public ::testing::TestWithParam<int> {};

TEST_P(CpuBackwardGrid, MatchesReference) {
  const GridCase c = grid_cases()[size_t(GetParam())];
  Grad g(c.spec, "grid " + c.name, c.dlse);
  const Ref ref = reference(g);
  g.args.backend = Backend::cpu;
  SCOPED_TRACE("kernel " + flashlite::backward_kernel_name(g.args));
  flashlite::backward(g.args);
  const double tol = tolerance(c.spec.dtype);
  expect_close("dq", g.args.dq, ref.dq, tol);
  expect_close("dk", g.args.dk, ref.dk, tol);
  expect_close("dv", g.args.dv, ref.dv, tol);
  if (c.spec.sink_logits) {
    const double bound = tol * std::max(1.0, max_abs(ref.dsink));
    for (int64_t h = 0; h < c.spec.hq; ++h) {
      EXPECT_NEAR(load(DType::f32, g.dsink.data(), h), ref.dsink[size_t(h)], bound) << "dsink[" << h << "]";
    }
  }
  expect_padding_untouched(g.dq, g.args.dq, "dq");
  expect_padding_untouched(g.dk, g.args.dk, "dk");
  expect_padding_untouched(g.dv, g.args.dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuBackwardGrid, ::testing::Range(0, int(grid_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return grid_cases()[size_t(info.param)].name; });

// The reference backend through backward() writes what reference_backward_f64 computes (rounded to the dtype).
TEST(ReferenceBackward, WritesTheFloat64Gradients) {
  Spec s;
  s.seq_q = 9, s.seq_k = 12, s.hq = 4, s.hkv = 2, s.d = 16, s.mask.causal = true, s.sink_logits = true;
  Grad g(s, "reference backend");
  const Ref ref = reference(g);
  g.args.backend = Backend::reference;
  flashlite::backward(g.args);
  expect_close("dq", g.args.dq, ref.dq, 1e-6);
  expect_close("dk", g.args.dk, ref.dk, 1e-6);
  expect_close("dv", g.args.dv, ref.dv, 1e-6);
}

// ---------------------------------------------------------------- 3. determinism and validation

// The same bits for any thread count and from either schedule: one pass (a task per sequence and kv head, taken when
// such tasks spread well over the threads) and two passes add every sum in the same order.
TEST(CpuBackward, BitwiseEqualAcrossRunsThreadCountsAndSchedules) {
  Spec causal;
  causal.seq_q = causal.seq_k = 300, causal.hq = 4, causal.hkv = 2, causal.d = 64, causal.mask.causal = true;
  causal.sink_logits = true;  // 2 (sequence, kv head) tasks: one pass with 1 and 2 threads, two passes with 3 and 8
  Spec varlen;
  varlen.hq = 6, varlen.hkv = 2, varlen.d = 40;
  varlen.varlen_q = {70, 0, 130, 1, 65};
  varlen.varlen_k = {90, 5, 130, 64, 0};
  varlen.extra_rows = 2;
  varlen.mask = {true, 50, -1, 3};
  varlen.softcap = 5.0, varlen.input_std = 3.0;
  varlen.sink_logits = true;  // 10 tasks of varlen: one pass up to 5 threads, two passes with 8
  for (const auto& [spec, name, dlse] : {std::tuple{causal, "causal", false}, std::tuple{varlen, "varlen", true}}) {
    Grad g(spec, std::string("determinism ") + name, dlse);
    g.args.backend = Backend::cpu;
    g.args.deterministic = true;
    const auto run = [&](int threads) {
      const int before = omp_get_max_threads();
      omp_set_num_threads(threads);
      flashlite::backward(g.args);
      omp_set_num_threads(before);
      std::vector<uint8_t> all;
      for (Buffer* b : {&g.dq, &g.dk, &g.dv, &g.dsink}) all.insert(all.end(), b->bytes.begin(), b->bytes.end());
      return all;
    };
    const auto first = run(2);
    EXPECT_EQ(first, run(2)) << name;
    for (int threads : {1, 3, 8}) EXPECT_EQ(first, run(threads)) << name << ", " << threads << " threads";
  }
}

// Each bad call throws an Error naming the argument and leaves every gradient buffer as it was.
TEST(BackwardValidation, BadArgumentsAreNamedAndNothingIsWritten) {
  Spec s;
  s.seq_q = 8, s.seq_k = 8, s.hq = 4, s.hkv = 2, s.d = 16, s.sink_logits = true;
  Grad g(s, "validation");
  Buffer other(DType::f32, 16);
  const auto expect_error = [&](const std::string& what, BackwardArgs a, const std::string& needle) {
    const auto before = std::vector{g.dq.bytes, g.dk.bytes, g.dv.bytes, g.dsink.bytes};
    try {
      flashlite::backward(a);
      ADD_FAILURE() << what << ": no error";
    } catch (const flashlite::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
    EXPECT_EQ(before, (std::vector{g.dq.bytes, g.dk.bytes, g.dv.bytes, g.dsink.bytes})) << what << ": wrote";
  };
  BackwardArgs a = g.args;
  a.lse = {};
  expect_error("no lse", a, "lse is missing");
  a = g.args;
  a.dsink_logits = {};
  expect_error("no dsink", a, "dsink_logits is missing");
  a = g.args;
  a.dq = g.args.dk;
  expect_error("dq shaped like k", a, "dq has shape");
  a = g.args;
  a.dv.dtype = DType::f16;
  expect_error("dv dtype", a, "dv has dtype");
  a = g.args;
  a.dk = g.args.dv;
  expect_error("dk is dv", a, "overlaps");
  a = g.args;
  a.dq = g.args.dout;
  expect_error("dq is dout", a, "dq overlaps dout");
  a = g.args;
  a.dout = {};
  expect_error("no dout", a, "dout is missing");
  a = g.args;
  a.dsink_logits = view_n(other.data(), DType::f32, {3}, {1});
  expect_error("dsink shape", a, "dsink_logits has shape");
  a = g.args;
  a.options.sink_logits = {};
  expect_error("dsink without sinks", a, "dsink_logits is given without sink_logits");
  a = g.args;
  a.backend = Backend::naive;
  expect_error("naive", a, "backend 'naive' has no backward");
}

}  // namespace
}  // namespace fltest
