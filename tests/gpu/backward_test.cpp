// The CUDA backward (backend 'cuda', automatic for CUDA tensors) against the float64 reference, on device copies of
// the CPU suite's problems (tests/cpu/backward_test.cpp's grid and more: sequence lengths around the 64-row tiles up
// to 1025, q_len != k_len both ways, head_dim 64 / 96 / 128, GQA 1, 2, 4, 8 and 6/2, every mask of the fused grids and
// their combinations, rows without keys, strided and unaligned layouts, varlen with empty and length-1 sequences,
// sink logits, softcap); fp16 / bf16. Gradients are NaN-poisoned before the call (padding must stay NaN, varlen rows
// outside every sequence must become zero).
//
// Tolerance (FlashAttention's rule): per gradient, the kernel's max abs error against float64 is at most twice the
// error of a plain low-precision implementation on the same inputs (P and dS rounded to the dtype before their
// matmuls, gradients rounded to the dtype; everything else exact), plus 1e-3 * max |reference| + 1e-4.
// Also: bitwise determinism (two runs, and a caller's workspace against an allocated one) and argument validation
// (unsupported head_dim / dtype named, nothing written). Every test skips cleanly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backward_util.h"
#include "common/backward_problem.h"
#include "common/grid_order.h"
#include "cuda/bwd_hopper/bwd_hopper.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/backward.h"
#include "gpu_util.h"
#include "test_overrides.h"

namespace fltest {
namespace {

using flashlite::BackwardArgs;

// A device copy of one host buffer; views into the host buffer are re-pointed into it.
struct DevCopy {
  Buffer* host = nullptr;
  void* dev = nullptr;
  DevCopy() = default;
  DevCopy(const DevCopy&) = delete;
  DevCopy& operator=(const DevCopy&) = delete;
  ~DevCopy() {
    if (dev) cudaFree(dev);
  }
  void upload(Buffer& b) {
    host = &b;
    cuda_check(cudaMalloc(&dev, b.bytes.size()), "cudaMalloc");
    cuda_check(cudaMemcpy(dev, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  TensorView on_device(TensorView t) const {
    t.data = static_cast<uint8_t*>(dev) + (static_cast<const uint8_t*>(t.data) - host->bytes.data());
    t.device = Device::cuda(0);
    return t;
  }
  void download() { cuda_check(cudaMemcpy(host->bytes.data(), dev, host->bytes.size(), cudaMemcpyDeviceToHost), "D2H"); }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(host->bytes.size());
    cuda_check(cudaMemcpy(out.data(), dev, out.size(), cudaMemcpyDeviceToHost), "D2H");
    return out;
  }
};

// A problem with the forward's out and lse (cpu backend), a random dout and poisoned gradients, on the host (hargs)
// and, unless host_only, mirrored on the device (args; otherwise args = hargs).
struct GpuGrad {
  Problem p;
  Buffer dout, dq, dk, dv, dsink, dlse;
  BackwardArgs hargs, args;
  std::unique_ptr<DeviceMirror> mirror;
  DevCopy ddout, ddq, ddk, ddv, ddsink, ddlse;

  // with_dlse: a random gradient for lse too (the loss depends on both outputs).
  GpuGrad(const Spec& s, const std::string& name, bool host_only = false, bool with_dlse = false)
      : p(s, seed_of(name)) {
    ForwardArgs f = p.args;
    f.backend = Backend::cpu;
    flashlite::forward(f);
    const int64_t B = s.tensor_batch(), RQ = s.rows_q(), RK = s.rows_k(), D = s.d;
    BackwardArgs& a = hargs;
    a.q = p.args.q, a.k = p.args.k, a.v = p.args.v, a.out = p.args.out, a.lse = p.args.lse;
    a.options = p.args.options;
    const Layout out_layout = s.out_layout == Layout::packed_qkv ? Layout::contiguous : s.out_layout;
    a.dout = make(dout, out_layout, {B, RQ, s.hq, D});
    std::mt19937_64 rng(seed_of(name + " dout"));
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < RQ; ++r)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t c = 0; c < D; ++c) set4(a.dout, b, r, h, c, normal(rng));
    a.dq = make(dq, out_layout, {B, RQ, s.hq, D});
    a.dk = make(dk, out_layout, {B, RK, s.hkv, D});
    a.dv = make(dv, out_layout, {B, RK, s.hkv, D});
    if (s.sink_logits) {
      dsink = Buffer(DType::f32, s.hq);
      dsink.poison();
      a.dsink_logits = view_n(dsink.data(), DType::f32, {s.hq}, {1});
    }
    if (with_dlse) {
      dlse = Buffer(DType::f32, B * s.hq * RQ);
      for (int64_t i = 0; i < dlse.numel(); ++i) store(DType::f32, dlse.data(), i, normal(rng));
      a.dlse = view_n(dlse.data(), DType::f32, {B, s.hq, RQ}, {s.hq * RQ, RQ, 1});
    }
    args = hargs;
    if (host_only) return;
    // Device side.
    mirror = std::make_unique<DeviceMirror>(p);
    args = hargs;
    args.q = mirror->args.q, args.k = mirror->args.k, args.v = mirror->args.v;
    args.out = mirror->args.out, args.lse = mirror->args.lse;
    args.options = mirror->args.options;  // sink logits on the device, cu_seqlens on the host
    ddout.upload(dout);
    ddq.upload(dq);
    ddk.upload(dk);
    ddv.upload(dv);
    args.dout = ddout.on_device(a.dout);
    args.dq = ddq.on_device(a.dq);
    args.dk = ddk.on_device(a.dk);
    args.dv = ddv.on_device(a.dv);
    if (s.sink_logits) {
      ddsink.upload(dsink);
      args.dsink_logits = ddsink.on_device(a.dsink_logits);
    }
    if (with_dlse) {
      ddlse.upload(dlse);
      args.dlse = ddlse.on_device(a.dlse);
    }
    args.backend = Backend::automatic;
  }
  TensorView make(Buffer& buf, Layout l, std::array<int64_t, 4> shape) {
    const Placement pl = place(l, shape);
    buf = Buffer(p.spec.dtype, pl.numel);
    buf.poison();
    return view4(buf, pl.offset, shape, pl.strides);
  }
  // The gradients back into the host buffers (hargs' views read them).
  void download() {
    cuda_check(cudaDeviceSynchronize(), "kernel execution");
    ddq.download();
    ddk.download();
    ddv.download();
    if (p.spec.sink_logits) ddsink.download();
  }
  bool on_device() const { return mirror != nullptr; }
  std::vector<uint8_t> device_bytes() {
    cuda_check(cudaDeviceSynchronize(), "kernel execution");
    std::vector<uint8_t> all;
    for (DevCopy* d : {&ddq, &ddk, &ddv, &ddsink}) {
      if (!d->dev) continue;
      const auto b = d->bytes();
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  }
};

using Grads = Grads64;

Grads reference(const GpuGrad& g) { return reference_grads(g.p.spec, g.hargs); }

float get3(const TensorView& t, int64_t b, int64_t h, int64_t r) {
  return load(t.dtype, t.data, b * t.strides[0] + h * t.strides[1] + r * t.strides[2]);
}

double round_to(DType t, double x) {
  uint8_t tmp[4];
  store(t, tmp, 0, float(x));
  return load(t, tmp, 0);
}

// A plain low-precision backward: the textbook gradients from the stored inputs with P and dS rounded to the dtype
// (as a plain fp16 / bf16 implementation feeds them to its matmuls) and the gradients rounded to the dtype.
Grads lowp_reference(const GpuGrad& g) {
  const Spec& s = g.p.spec;
  const BackwardArgs& a = g.hargs;
  const DType t = s.dtype;
  const int64_t D = s.d, RQ = s.rows_q(), RK = s.rows_k(), group = s.hq / s.hkv;
  const double scale = s.scale ? *s.scale : 1.0 / std::sqrt(double(D));
  Grads r;
  r.dq.assign(size_t(s.tensor_batch() * RQ * s.hq * D), 0.0);
  r.dk.assign(size_t(s.tensor_batch() * RK * s.hkv * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  r.dsink.assign(size_t(s.hq), 0.0);
  const auto rows = [&](const TensorView& v, int64_t b, int64_t r0, int64_t n, int64_t h) {
    std::vector<double> m(size_t(n * D));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < D; ++c) m[size_t(i * D + c)] = get4(v, b, r0 + i, h, c);
    return m;
  };
  for (const Seq& q : sequences_of(s)) {
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t kh = h / group;
      const auto Q = rows(a.q, q.b, q.q0, q.sq, h), O = rows(a.out, q.b, q.q0, q.sq, h);
      const auto dO = rows(a.dout, q.b, q.q0, q.sq, h);
      const auto K = rows(a.k, q.b, q.k0, q.sk, kh), V = rows(a.v, q.b, q.k0, q.sk, kh);
      const double sink = g.p.sink_logit(h);
      std::vector<double> logit(size_t(q.sk));
      std::vector<char> vis(size_t(q.sk));
      for (int64_t i = 0; i < q.sq; ++i) {
        const double* qi = &Q[size_t(i * D)];
        const double* oi = &dO[size_t(i * D)];
        double m = sink;
        for (int64_t j = 0; j < q.sk; ++j) {
          vis[size_t(j)] = doc_visible(s.mask, i, j, q.sq, q.sk);
          if (!vis[size_t(j)]) continue;
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += qi[c] * K[size_t(j * D + c)];
          double x = dot * scale;
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          logit[size_t(j)] = x;
          m = std::max(m, x);
        }
        if (m == -kInf) continue;  // no key and no sink: nothing flows
        double total = sink > -kInf ? std::exp(sink - m) : 0.0;
        for (int64_t j = 0; j < q.sk; ++j)
          if (vis[size_t(j)]) total += std::exp(logit[size_t(j)] - m);
        const double lse = m + std::log(total);
        double delta = a.dlse.data ? -double(get3(a.dlse, q.b, h, q.q0 + i)) : 0.0;
        for (int64_t c = 0; c < D; ++c) delta += oi[c] * O[size_t(i * D + c)];
        double* dqi = &r.dq[size_t(((q.b * RQ + q.q0 + i) * s.hq + h) * D)];
        for (int64_t j = 0; j < q.sk; ++j) {
          if (!vis[size_t(j)]) continue;
          const double pr = round_to(t, std::exp(logit[size_t(j)] - lse));
          double dp = 0;
          for (int64_t c = 0; c < D; ++c) dp += oi[c] * V[size_t(j * D + c)];
          double ds = pr * (dp - delta);
          if (s.softcap > 0) ds *= 1 - (logit[size_t(j)] / s.softcap) * (logit[size_t(j)] / s.softcap);
          ds = round_to(t, ds);
          double* dkj = &r.dk[size_t(((q.b * RK + q.k0 + j) * s.hkv + kh) * D)];
          double* dvj = &r.dv[size_t(((q.b * RK + q.k0 + j) * s.hkv + kh) * D)];
          for (int64_t c = 0; c < D; ++c) {
            dvj[c] += pr * oi[c];
            dkj[c] += scale * ds * qi[c];
            dqi[c] += scale * ds * K[size_t(j * D + c)];
          }
        }
        if (sink > -kInf) r.dsink[size_t(h)] -= std::exp(sink - lse) * delta;
      }
    }
  }
  for (auto* v : {&r.dq, &r.dk, &r.dv})
    for (double& x : *v) x = round_to(t, x);
  return r;
}

// The view's elements ([b, rows, heads, d]) as a contiguous vector.
std::vector<double> gather(const TensorView& t) {
  std::vector<double> out;
  out.reserve(size_t(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]));
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t r = 0; r < t.shape[1]; ++r)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t c = 0; c < t.shape[3]; ++c) out.push_back(get4(t, b, r, h, c));
  return out;
}

// got within 2 * (max error of the low-precision reference) + 1e-3 * max |ref| + 1e-4 of ref, element by element
// (NaN fails).
void expect_within_rule(const char* name, const std::vector<double>& got, const std::vector<double>& ref,
                        const std::vector<double>& lowp) {
  double lowp_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) lowp_err = std::max(lowp_err, std::fabs(lowp[i] - ref[i]));
  // 1e-4: fp32 rounding where the exact gradient cancels to 0 (a diagonal mask: dP = D exactly, which the
  // low-precision reference reproduces bit for bit and fp32 accumulation does not).
  const double bound = 2 * lowp_err + 1e-3 * max_abs(ref) + 1e-4;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    if (!(err <= bound) && bad++ < 5) {
      ADD_FAILURE() << name << " element " << i << " = " << got[i] << ", reference " << ref[i] << " (bound " << bound
                    << ")";
    }
    if (std::isfinite(err)) worst = std::max(worst, err);
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " elements off; worst finite error " << worst << ", low-precision "
                    << lowp_err << ", max |ref| " << max_abs(ref);
}

// ---------------------------------------------------------------- the grid

struct GridCase {
  std::string name;
  Spec spec;
  bool dlse = false;  // the loss depends on lse too
};

std::vector<GridCase> grid_cases() {
  std::vector<GridCase> cs;
  const auto add = [&](const std::string& name, Spec s, bool dlse = false) {
    for (DType t : {DType::f16, DType::bf16}) {
      s.dtype = t;
      cs.push_back({std::string(dt_name(t)) + "_" + name, s, dlse});
    }
  };
  const auto shape = [](int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
    Spec s;
    s.seq_q = sq, s.seq_k = sk, s.hq = hq, s.hkv = hkv, s.d = d;
    return s;
  };
  // Sequence lengths around the 64-row tiles, full and causal.
  for (int64_t seq : {1, 2, 17, 64, 130, 1000, 1025}) {
    Spec s = seq >= 1000 ? shape(seq, seq, 2, 1, 64) : shape(seq, seq, 4, 2, 64);
    add("seq" + std::to_string(seq), s);
    s.mask.causal = true;
    add("seq" + std::to_string(seq) + "_causal", s);
  }
  // Head dims and GQA ratios.
  for (int64_t d : {64, 96, 128}) {
    Spec s = shape(130, 130, 4, 1, d);
    s.batch = 2;
    add("d" + std::to_string(d) + "_gqa4_batch2", s);
    s.mask.causal = true;
    add("d" + std::to_string(d) + "_gqa4_batch2_causal", s);
  }
  {
    Spec s = shape(1025, 1025, 2, 2, 128);
    s.mask.causal = true;
    s.sink_logits = true;
    add("d128_seq1025_causal_sinklogits", s);
  }
  for (auto [hq, hkv] : {std::pair{1, 1}, {2, 1}, {8, 1}, {6, 2}}) {
    Spec s = shape(100, 100, hq, hkv, 64);
    add("gqa" + std::to_string(hq) + "x" + std::to_string(hkv), s);
  }
  // q_len != k_len both ways.
  {
    Spec s = shape(40, 150, 8, 1, 64);
    s.mask.causal = true;
    add("qshort_gqa8_causal", s);
    s = shape(150, 40, 6, 2, 64);  // the first 110 rows see no key
    s.mask.causal = true;
    s.sink_logits = true;
    add("qlong_gqa3_causal_sinklogits", s);
    add("qlong_gqa3_causal_sinklogits_dlse", s, true);
    s = shape(300, 70, 2, 1, 128);  // rows without keys, no sink: lse -inf
    s.mask = {true, 10, -1, 0};
    add("qlong_causal_win10_d128", s);
  }
  // Every mask of the fused grids (and their combinations, sink logits and softcap), both ways round.
  for (const MaskCase& m : mask_cases()) {
    for (auto [sq, sk] : {std::pair{130, 200}, {200, 130}}) {
      Spec s = shape(sq, sk, 4, 2, 64);
      s.mask = m.mask;
      s.sink_logits = m.sink_logits;
      s.softcap = m.softcap;
      if (m.softcap > 0) s.input_std = 3.0;  // the cap bites
      add(std::string(m.name) + "_q" + std::to_string(sq) + "_k" + std::to_string(sk), s);
    }
  }
  {
    Spec s = shape(200, 200, 4, 4, 128);
    s.mask = {true, 50, -1, 4};
    s.sink_logits = true;
    add("window_sinks_sinklogits_d128", s);
    s = shape(100, 100, 2, 1, 96);
    s.batch = 2;
    s.mask = {false, 20, 10, 0};
    s.softcap = 5.0, s.input_std = 3.0;
    s.scale = 0.2;
    s.in_layout = Layout::padded, s.out_layout = Layout::padded;  // unaligned rows: the scalar load / store path
    add("window_both_softcap_d96_padded", s);
  }
  // Strided layouts.
  {
    Spec s = shape(70, 90, 4, 2, 64);
    s.batch = 3;
    s.in_layout = Layout::heads_major, s.out_layout = Layout::seq_first, s.lse = LseMode::transposed;
    add("strided_layouts", s);
    s = shape(129, 129, 4, 2, 128);
    s.mask.causal = true;
    s.in_layout = Layout::packed_qkv;
    add("packed_qkv_causal_d128", s);
  }
  // Varlen with empty and length-1 sequences and rows past the last sequence.
  {
    Spec s = shape(0, 0, 4, 2, 64);
    s.varlen_q = {70, 0, 1, 33, 129, 5};
    s.varlen_k = {80, 5, 1, 0, 129, 200};
    s.extra_rows = 3;
    s.mask.causal = true;
    s.sink_logits = true;
    add("varlen_causal_sinklogits", s);
    add("varlen_causal_sinklogits_dlse", s, true);
    s.mask = {false, 16, 4, 2};
    s.sink_logits = false;
    s.d = 128;
    add("varlen_window_sinks_d128", s);
  }
  // Sink tokens with a narrow window: key block 0 is far heavier than the rest, so the dK / dV grids run every
  // head's block 0 first (sink_block_leads holds for both families' block sizes; a test below checks it).
  {
    Spec s = shape(700, 700, 4, 2, 64);
    s.batch = 2;
    s.mask = {true, 50, -1, 4};
    s.sink_logits = true;
    add("window_sinks_block0_leads_q700", s);
    s = shape(0, 0, 4, 4, 128);
    s.varlen_q = {700, 0, 300, 650};
    s.varlen_k = {700, 0, 500, 650};
    s.mask = {true, 40, -1, 3};
    s.sink_logits = false;
    add("varlen_window_sinks_block0_leads_d128", s);
  }
  // Sink tokens under a window with GQA (key block 0's items of several heads), q_len != k_len, softcap, a right
  // window; at both families' block sizes, past the window the sinks are all that key block 0's q blocks see.
  {
    Spec s = shape(900, 850, 6, 2, 128);
    s.mask = {true, 100, -1, 3};
    s.sink_logits = true;
    s.softcap = 20.0, s.input_std = 3.0;
    add("gqa3_window_sinks_softcap_d128", s);
    s = shape(1100, 1100, 8, 2, 64);
    s.mask = {true, 64, -1, 2};
    s.sink_logits = false, s.softcap = 0.0, s.input_std = 1.0;
    add("gqa4_window_sinks_d64", s);
    s = shape(600, 600, 4, 2, 128);
    s.mask = {false, 60, 30, 4};
    add("window_both_sinks_d128", s);
    // The Hopper dQ kernel takes a sink tile past the window over its first 16 keys alone: 16 sinks fill them, 17
    // keep the whole tile.
    s = shape(900, 900, 4, 2, 64);
    s.mask = {true, 150, -1, 16};
    add("window_sinks16_d64", s);
    s = shape(700, 650, 4, 2, 128);
    s.mask = {true, 90, -1, 17};
    add("window_sinks17_d128", s);
  }
  // Grids of several waves (the cases above fit in one on an H100's 132 SMs): dK / dV 160 CTAs and dQ 640 here;
  // varlen, 480 each, most of them past a sequence's end.
  {
    Spec s = shape(520, 520, 32, 8, 64);
    s.batch = 4;
    s.mask.causal = true;
    add("waves_gqa4_causal", s);
    s = shape(0, 0, 8, 8, 128);
    s.varlen_q = {520, 0, 1, 390, 260, 130, 700, 520, 64, 333};
    s.varlen_k = s.varlen_q;
    s.mask = {true, 200, -1, 4};
    s.sink_logits = true;
    add("waves_varlen_window_sinks_d128", s);
  }
  return cs;
}

class GpuBackwardGrid : public ::testing::TestWithParam<int> {};

// Runs the backward of grid case c (on the device, or the cpu backend on the host) and applies the rule.
void check_case(const GridCase& c, bool host_only) {
  GpuGrad g(c.spec, "gpu backward " + c.name, host_only, c.dlse);
  if (host_only) g.args.backend = Backend::cpu;
  const flashlite::BackwardOverrides o = host_only ? flashlite::BackwardOverrides{} : cuda_backward_overrides();
  const std::string kernel = flashlite::backward_kernel_name(g.args, o);
  SCOPED_TRACE("kernel " + kernel);
  if (!host_only) {
    EXPECT_EQ(kernel.rfind("cuda_backward_", 0), 0u);
    if (suite_overrides().no_hopper) {
      EXPECT_EQ(kernel.rfind("cuda_backward_mma_", 0), 0u);
    }
  }
  flashlite::backward(g.args, o);
  if (!host_only) g.download();
  const Grads ref = reference(g), lowp = lowp_reference(g);
  expect_within_rule("dq", gather(g.hargs.dq), ref.dq, lowp.dq);
  expect_within_rule("dk", gather(g.hargs.dk), ref.dk, lowp.dk);
  expect_within_rule("dv", gather(g.hargs.dv), ref.dv, lowp.dv);
  if (c.spec.sink_logits) {
    std::vector<double> got(size_t(c.spec.hq));
    for (int64_t h = 0; h < c.spec.hq; ++h) got[size_t(h)] = load(DType::f32, g.dsink.data(), h);
    expect_within_rule("dsink", got, ref.dsink, lowp.dsink);
  }
  expect_padding_untouched(g.dq, g.hargs.dq, "dq");
  expect_padding_untouched(g.dk, g.hargs.dk, "dk");
  expect_padding_untouched(g.dv, g.hargs.dv, "dv");
}

TEST_P(GpuBackwardGrid, WithinTwiceLowPrecisionError) {
  FL_SKIP_WITHOUT_GPU();
  check_case(grid_cases()[size_t(GetParam())], false);
}

// The rule itself, without a GPU: the cpu backend (fp32 arithmetic, gradients rounded to the dtype) meets it on the
// grid's smaller cases, so the low-precision reference and the checks are sound (and catch an unwritten element).
TEST(LowPrecisionRule, CpuBackendMeetsItOnSmallCases) {
  for (const GridCase& c : grid_cases()) {
    const Spec& s = c.spec;
    if (s.rows_q() * s.rows_k() * s.hq * s.d > 200 * 200 * 4 * 64) continue;
    SCOPED_TRACE(c.name);
    check_case(c, true);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuBackwardGrid, ::testing::Range(0, int(grid_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return grid_cases()[size_t(info.param)].name; });

// ---------------------------------------------------------------- determinism, workspace, names, validation

TEST(GpuBackward, BitwiseEqualAcrossRunsAndWorkspaces) {
  FL_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f16, DType::bf16}) {
    Spec s;
    s.seq_q = s.seq_k = 700, s.hq = 8, s.hkv = 2, s.d = 128, s.batch = 2, s.dtype = t;
    s.mask = {true, 300, -1, 3};
    s.sink_logits = true;
    GpuGrad g(s, std::string("gpu determinism ") + dt_name(t));
    g.args.deterministic = true;
    const flashlite::BackwardOverrides o = cuda_backward_overrides();
    SCOPED_TRACE(flashlite::backward_kernel_name(g.args, o));
    flashlite::backward(g.args, o);
    const auto first = g.device_bytes();
    flashlite::backward(g.args, o);
    EXPECT_EQ(first, g.device_bytes()) << dt_name(t) << ": second run differs";
    // A caller's workspace gives the same bits.
    const size_t bytes = flashlite::backward_workspace_bytes(g.args, o);
    EXPECT_GT(bytes, 0u);
    void* ws = nullptr;
    FL_CUDA_OK(cudaMalloc(&ws, bytes));
    BackwardArgs a = g.args;
    a.workspace = ws, a.workspace_bytes = bytes;
    flashlite::backward(a, o);
    EXPECT_EQ(first, g.device_bytes()) << dt_name(t) << ": caller's workspace differs";
    a.workspace_bytes = bytes - 1;
    EXPECT_THROW(flashlite::backward(a, o), flashlite::Error);
    FL_CUDA_OK(cudaFree(ws));
  }
}

// A varlen backward copies its offsets from host memory on every call, which a CUDA graph cannot replay: under capture
// it is refused by name before anything is enqueued (the capture ends cleanly with no node, its workspace allocation
// included), and the same call outside the capture runs.
TEST(GpuBackward, VarlenCallIsRefusedUnderCaptureWithNothingEnqueued) {
  FL_SKIP_WITHOUT_GPU();
  Spec s;
  s.dtype = DType::bf16, s.hq = 4, s.hkv = 2, s.d = 64, s.mask.causal = true;
  s.varlen_q = {70, 0, 33};
  s.varlen_k = {70, 5, 33};
  GpuGrad g(s, "gpu varlen capture");
  cudaStream_t stream = nullptr;
  FL_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BackwardArgs a = g.args;
  a.stream = stream;
  FL_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    flashlite::backward(a, cuda_backward_overrides());
    ADD_FAILURE() << "a varlen backward was captured";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph cannot capture"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  FL_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  size_t nodes = 1;
  FL_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u) << "the refused call enqueued work";
  FL_CUDA_OK(cudaGraphDestroy(graph));
  flashlite::backward(a, cuda_backward_overrides());
  FL_CUDA_OK(cudaStreamSynchronize(stream));
  FL_CUDA_OK(cudaStreamDestroy(stream));
}

// A varlen sequence's non-finite values never reach another sequence's gradients. Tiles that cross a sequence's end
// hold the next sequence's rows, masked, where 0 x Inf = NaN would leak (the Hopper kernels zero those rows in shared
// memory; the mma.sync ones never load them). Sequences: A; P, queries without keys (its q and dout rows then made
// +-Inf / NaN); B; K, keys without queries (its k and v rows likewise); C. Every gradient byte must equal that of the
// run with P's and K's rows finite (P's dq and K's dk, dv are zero both times; the others are untouched by them).
TEST(GpuBackward, VarlenKeepsNonFiniteValuesInTheirSequence) {
  FL_SKIP_WITHOUT_GPU();
  for (const int64_t d : {64, 128}) {
    for (const bool causal : {false, true}) {
      Spec s;
      s.dtype = DType::bf16, s.hq = 4, s.hkv = 2, s.d = d, s.mask.causal = causal;
      s.varlen_q = {70, 50, 40, 0, 20};
      s.varlen_k = {70, 0, 30, 90, 20};
      std::string name = "gpu varlen non-finite d";  // (appended: GCC 12 warns, wrongly, on "literal" + string&&)
      name += std::to_string(d);
      name += causal ? " causal" : "";
      GpuGrad g(s, name);
      const flashlite::BackwardOverrides o = cuda_backward_overrides();
      SCOPED_TRACE(name + " " + flashlite::backward_kernel_name(g.args, o));
      flashlite::backward(g.args, o);
      const auto finite = g.device_bytes();
      // Rows [r0, r1) of a contiguous [1, rows, heads, d] bf16 device view: +Inf, -Inf, NaN in turn.
      const auto poison_rows = [&](const TensorView& t, int64_t r0, int64_t r1) {
        const int64_t per_row = t.shape[2] * t.shape[3];
        std::vector<uint16_t> bits(size_t((r1 - r0) * per_row));
        for (size_t i = 0; i < bits.size(); ++i) bits[i] = i % 3 == 0 ? 0x7F80 : i % 3 == 1 ? 0xFF80 : 0x7FC0;
        FL_CUDA_OK(cudaMemcpy(static_cast<uint16_t*>(t.data) + r0 * per_row, bits.data(), bits.size() * 2,
                              cudaMemcpyHostToDevice));
      };
      poison_rows(g.args.q, 70, 120);     // P's queries (A has 70)
      poison_rows(g.args.dout, 70, 120);
      poison_rows(g.args.k, 100, 190);    // K's keys (A 70, P 0, B 30 before them)
      poison_rows(g.args.v, 100, 190);
      flashlite::backward(g.args, o);
      EXPECT_EQ(finite, g.device_bytes()) << "another sequence's non-finite rows changed a gradient";
    }
  }
}

TEST(GpuBackward, KernelNameAndStream) {
  FL_SKIP_WITHOUT_GPU();
  Spec s;
  s.seq_q = s.seq_k = 90, s.hq = 2, s.hkv = 1, s.d = 128, s.dtype = DType::bf16;
  GpuGrad g(s, "gpu name");
  g.args.backend = Backend::cuda;
  // sm_90 (this build has its 90a code): the Hopper kernels by default; the mma.sync ones when forced.
  cudaDeviceProp prop{};
  FL_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  const bool hopper = prop.major == 9 && prop.minor == 0 && flashlite::cuda_fwd_hopper::hopper_fwd_built();
  EXPECT_EQ(flashlite::backward_kernel_name(g.args), hopper ? "cuda_backward_hopper_bf16_d128" : "cuda_backward_mma_bf16_d128");
  EXPECT_EQ(flashlite::backward_kernel_name(g.args, {flashlite::BackwardKernel::cuda_mma}), "cuda_backward_mma_bf16_d128");
  if (hopper) {
    EXPECT_EQ(flashlite::backward_kernel_name(g.args, {flashlite::BackwardKernel::cuda_hopper}),
              "cuda_backward_hopper_bf16_d128");
  }
  cudaStream_t stream = nullptr;
  FL_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  g.args.stream = stream;
  flashlite::backward(g.args);
  FL_CUDA_OK(cudaStreamSynchronize(stream));
  FL_CUDA_OK(cudaStreamDestroy(stream));
  g.download();
  const Grads ref = reference(g), lowp = lowp_reference(g);
  expect_within_rule("dq", gather(g.hargs.dq), ref.dq, lowp.dq);
  expect_within_rule("dk", gather(g.hargs.dk), ref.dk, lowp.dk);
  expect_within_rule("dv", gather(g.hargs.dv), ref.dv, lowp.dv);
}

// Unsupported shapes and dtypes are refused by name, with nothing written.
TEST(GpuBackwardValidation, UnsupportedIsNamedAndNothingIsWritten) {
  FL_SKIP_WITHOUT_GPU();
  const auto expect_refused = [](Spec s, const std::string& needle) {
    GpuGrad g(s, "gpu validation " + needle);
    const auto before = g.device_bytes();
    try {
      flashlite::backward(g.args);
      ADD_FAILURE() << needle << ": no error";
    } catch (const flashlite::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_THROW(flashlite::backward_kernel_name(g.args), flashlite::Error);
    EXPECT_EQ(before, g.device_bytes()) << needle << ": wrote";
  };
  Spec s;
  s.seq_q = s.seq_k = 20, s.hq = 2, s.hkv = 1, s.dtype = DType::bf16, s.sink_logits = true;
  s.d = 256;
  expect_refused(s, "head_dim 256");
  s.d = 32;
  expect_refused(s, "head_dim 32");
  s.d = 80;
  expect_refused(s, "head_dim 80");
  s.d = 64, s.dtype = DType::f32;
  expect_refused(s, "dtype float32");
}

// A forced kernel that cannot run a call is refused by name, with nothing written.
TEST(GpuBackwardValidation, ForcedKernelThatCannotRunIsNamed) {
  FL_SKIP_WITHOUT_GPU();
  Spec s;
  s.seq_q = s.seq_k = 20, s.hq = 2, s.hkv = 1, s.d = 96, s.dtype = DType::bf16;
  GpuGrad g(s, "gpu forced hopper d96");
  const auto before = g.device_bytes();
  try {
    flashlite::backward(g.args, {flashlite::BackwardKernel::cuda_hopper});
    ADD_FAILURE() << "no error";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_hopper cannot run this call"), std::string::npos) << e.what();
  }
  try {
    flashlite::backward(g.args, {flashlite::BackwardKernel::cpu_tiled});
    ADD_FAILURE() << "no error";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not agree with backend"), std::string::npos) << e.what();
  }
  EXPECT_EQ(before, g.device_bytes());
}

// The grid cases named "block0_leads" take the sink-block-first order (common/grid_order.h) in both families (mma.sync:
// 64-row q blocks, 64-key blocks; Hopper dK / dV: 64 x 128), so the grid runs that order (a few short cases whose last
// key block is small take it too). Host logic only: runs without a GPU.
TEST(BackwardGridOrder, Block0LeadsWhereTheCaseSaysSo) {
  int named = 0;
  for (const GridCase& c : grid_cases()) {
    if (c.name.find("block0_leads") == std::string::npos) continue;
    const Spec& s = c.spec;
    const flashlite::MaskParams mask{s.mask.causal, s.mask.wl, s.mask.wr, s.mask.sinks};
    const int64_t sq = s.varlen() ? *std::max_element(s.varlen_q.begin(), s.varlen_q.end()) : s.seq_q;
    const int64_t sk = s.varlen() ? *std::max_element(s.varlen_k.begin(), s.varlen_k.end()) : s.seq_k;
    EXPECT_TRUE(flashlite::sink_block_leads(mask, sq, sk, 64, 64)) << c.name;
    EXPECT_TRUE(flashlite::sink_block_leads(mask, sq, sk, 64, 128)) << c.name;
    ++named;
  }
  EXPECT_EQ(named, 4);  // two cases, f16 and bf16
}

// Which calls the Hopper backward takes (host logic only: runs without a GPU). Pointers are never dereferenced.
TEST(HopperBackwardEligibility, ReasonsNameWhatIsMissing) {
  alignas(16) static unsigned char arena[1 << 12];
  flashlite::BackwardProblem bp;
  flashlite::AttentionProblem& p = bp.fwd;
  p.dtype = DType::bf16, p.batch = 2, p.seq_q = 300, p.seq_k = 500, p.q_heads = 8, p.kv_heads = 2, p.head_dim = 128;
  const flashlite::RowStrides q_st{300 * 8 * 128, 8 * 128, 128}, k_st{500 * 2 * 128, 2 * 128, 128};
  p.q = p.k = p.v = arena;
  bp.dout = arena;
  bp.dq = bp.dk = bp.dv = arena;
  p.q_stride = bp.dout_stride = bp.dq_stride = q_st;
  p.k_stride = p.v_stride = bp.dk_stride = bp.dv_stride = k_st;
  using flashlite::cuda_bwd_hopper::bwd_hopper_reject_reason;
  EXPECT_EQ(bwd_hopper_reject_reason(bp, 90), "");
  EXPECT_NE(bwd_hopper_reject_reason(bp, 80).find("compute capability 9.0"), std::string::npos);
  EXPECT_NE(bwd_hopper_reject_reason(bp, 100).find("compute capability 9.0"), std::string::npos);
  const auto with = [&](auto change, const char* needle) {
    flashlite::BackwardProblem b = bp;
    change(b);
    EXPECT_NE(bwd_hopper_reject_reason(b, 90).find(needle), std::string::npos) << needle;
  };
  with([](auto& b) { b.fwd.head_dim = 96; }, "head_dim 64 or 128");
  with([](auto& b) { b.fwd.dtype = DType::f32; }, "float16 or bfloat16");
  const int32_t cu[3] = {0, 100, 300}, empty[3] = {0, 0, 0};
  flashlite::BackwardProblem varlen = bp;  // varlen: the tensors are one "batch" of the sequences' rows
  varlen.fwd.cu_seqlens_q = varlen.fwd.cu_seqlens_k = cu;
  EXPECT_EQ(bwd_hopper_reject_reason(varlen, 90), "");
  varlen.fwd.cu_seqlens_q = varlen.fwd.cu_seqlens_k = empty;
  EXPECT_NE(bwd_hopper_reject_reason(varlen, 90).find("at least one sequence, query row and key row"), std::string::npos);
  with([](auto& b) { b.fwd.k = arena + 2; }, "TMA");
  with([](auto& b) { b.dout_stride.seq = 129; }, "TMA");
  with([](auto& b) { b.dout_stride.head = 129; }, "TMA");
  with([](auto& b) { b.dk = arena + 2; }, "4-byte pairs");
  with([](auto& b) { b.dq_stride.seq = 129; }, "4-byte pairs");
  with([](auto& b) { b.fwd.batch = 0; }, "at least one sequence");
  flashlite::BackwardProblem one = bp;  // strides of extent-1 dimensions never step: odd ones are fine there
  one.fwd.batch = 1, one.dq_stride.batch = one.dk_stride.batch = 3;
  EXPECT_EQ(bwd_hopper_reject_reason(one, 90), "");
  flashlite::BackwardProblem f16 = bp;
  f16.fwd.dtype = DType::f16, f16.fwd.head_dim = 64;
  EXPECT_EQ(bwd_hopper_reject_reason(f16, 90), "");
  EXPECT_EQ(flashlite::cuda_bwd_hopper::bwd_hopper_kernel_name(f16), "cuda_backward_hopper_f16_d64");
}

// Bad arguments are caught before anything runs (the shared validation, on CUDA tensors).
TEST(GpuBackwardValidation, BadArgumentsOnCudaTensors) {
  FL_SKIP_WITHOUT_GPU();
  Spec s;
  s.seq_q = s.seq_k = 20, s.hq = 4, s.hkv = 2, s.d = 64, s.dtype = DType::f16, s.sink_logits = true;
  GpuGrad g(s, "gpu bad arguments");
  const auto before = g.device_bytes();
  const auto expect_error = [&](const std::string& what, BackwardArgs a, const std::string& needle) {
    try {
      flashlite::backward(a);
      ADD_FAILURE() << what << ": no error";
    } catch (const flashlite::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  BackwardArgs a = g.args;
  a.dsink_logits = {};
  expect_error("no dsink", a, "dsink_logits is missing");
  a = g.args;
  a.dk = g.args.dv;
  expect_error("dk is dv", a, "overlaps");
  a = g.args;
  a.backend = Backend::cpu;
  expect_error("cpu backend on cuda tensors", a, "backend 'cpu' needs CPU tensors");
  a = g.args;
  a.dq = g.hargs.dq;  // a host view among device ones
  expect_error("dq on the host", a, "dq");
  EXPECT_EQ(before, g.device_bytes());
}

}  // namespace
}  // namespace fltest
