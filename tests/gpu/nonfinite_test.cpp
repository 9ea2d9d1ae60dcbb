// Non-finite inputs and long rows on the CUDA backends (skipped without a GPU): the cases of the CPU suite
// (tests/cpu/nonfinite_util.h: NaN, +inf and -inf in q, in the K or V row of a key every / some / no query row sees, in
// a sink logit; every mask kind; fp32 / fp16 / bf16) through the fused kernel (backend 'cuda': the Hopper kernel on
// sm_90, mma.sync elsewhere or in the --no-hopper re-run, the fp32 SIMT kernel for fp32) and the split naive kernels
// (backend 'naive'); the KV-cache decode kernel (one split, forced splits with their merge in a cluster or, in the
// --combine re-run, the combine kernel); then long rows (2^22 + 7 keys) against the float64 mean of V.
// Every failure names the kernel that ran.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_util.h"
#include "nonfinite_kv.h"
#include "nonfinite_util.h"

namespace fltest::nonfinite {
namespace {

using Param = std::tuple<int, DType, Backend>;  // case index, dtype, backend (cuda or naive)

class GpuNonFinite : public ::testing::TestWithParam<Param> {};

TEST_P(GpuNonFinite, FollowsTheRule) {
  FL_SKIP_WITHOUT_GPU();
  const auto [index, dtype, backend] = GetParam();
  const NfCase c = nf_cases(dtype, true)[size_t(index)];
  Problem p(c.spec, seed_of("nonfinite " + c.name));
  std::string kernel;
  const auto run = [&] {
    fill_outputs(p, kSentinel);
    DeviceMirror m(p);  // copies the inputs as they are now (poison included) and the sentinel outputs
    m.args.backend = backend;
    kernel = fltest::suite_forward_kernel_name(m.args);
    fltest::suite_forward(m.args);
    m.copy_back();
    return read_outputs(p);
  };
  const Outputs clean = run();
  SCOPED_TRACE("kernel " + kernel);
  reference_mismatches(c.spec, clean, reference64(p), out_tolerance(dtype), 1e-4);
  for (const Poison& z : poisons(c)) {
    SCOPED_TRACE(describe(z));
    const float old = put(p, z, z.value);
    const Outputs got = run();
    rule_violations(p, z, clean, got, /*masked_v_leaks=*/true);
    reference_mismatches(c.spec, got, reference64(p), out_tolerance(dtype), 1e-4, &z);
    put(p, z, old);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuNonFinite,
                         ::testing::Combine(::testing::Range(0, int(nf_cases(DType::f32, true).size())),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(Backend::cuda, Backend::naive)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const DType t = std::get<1>(info.param);
                           return nf_cases(t, true)[size_t(std::get<0>(info.param))].name + "_" + dtype_tag(t) + "_" +
                                  flashlite::backend_name(std::get<2>(info.param));
                         });

// ---- The KV-cache decode kernel.

void ck(cudaError_t e, const char* what) { cuda_check(e, what); }

struct DevBytes {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBytes(const std::vector<uint8_t>& host) : n(host.size()) {
    ck(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc");
    if (n) ck(cudaMemcpy(p, host.data(), n, cudaMemcpyHostToDevice), "H2D");
  }
  template <class T>
  explicit DevBytes(const std::vector<T>& host)
      : DevBytes(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(host.data()),
                                      reinterpret_cast<const uint8_t*>(host.data()) + host.size() * sizeof(T))) {}
  DevBytes(const DevBytes&) = delete;
  DevBytes& operator=(const DevBytes&) = delete;
  ~DevBytes() { cudaFree(p); }
  void down(std::vector<uint8_t>& host) const { ck(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), "D2H"); }
};

TensorView on_device(TensorView t, void* data) {
  t.data = data;
  t.device = Device::cuda(0);
  return t;
}

// Runs decode() on device copies of p (its cache, q, sink logits, sentinel outputs) with `splits` KV splits (0: the
// plan's choice); the outputs come back into p's host buffers. Returns the kernel's name.
std::string decode_on_device(kvtest::DecodeProblem& p, int splits) {
  kvtest::HostCache& c = p.cache;
  DevBytes k(c.kbuf.bytes), v(c.vbuf.bytes), lens(c.seq_lens), indptr(c.indptr), indices(c.indices), last(c.last);
  DevBytes q(p.qbuf.bytes), out(p.outbuf.bytes), lse(p.lsebuf.bytes), sink(p.sinkbuf.bytes);
  flashlite::DecodeArgs a = p.args;
  a.cache.k = on_device(c.view.k, k.p);
  a.cache.v = on_device(c.view.v, v.p);
  if (!c.spec.paged) {
    a.cache.device.seq_lens = on_device(c.view.host.seq_lens, lens.p);
  } else {
    a.cache.device.page_indptr = on_device(c.view.host.page_indptr, indptr.p);
    a.cache.device.page_indices = on_device(c.view.host.page_indices, indices.p);
    a.cache.device.last_page_len = on_device(c.view.host.last_page_len, last.p);
  }
  a.q = on_device(p.args.q, q.p);
  a.out = on_device(p.args.out, out.p);
  a.lse = on_device(p.args.lse, lse.p);
  if (p.spec.sink_logits) a.options.sink_logits = on_device(p.args.options.sink_logits, sink.p);
  a.backend = Backend::cuda;
  // Under the suite's merge (--combine: the combine kernel), one split or the forced count.
  const flashlite::DecodePlan plan = fltest::suite_plan_decode(a, -1, splits);
  a.plan = &plan;
  const std::string name = flashlite::decode_kernel_name(a);
  flashlite::decode(a);
  ck(cudaDeviceSynchronize(), "decode");
  out.down(p.outbuf.bytes);
  lse.down(p.lsebuf.bytes);
  return name;
}

using KvParam = std::tuple<bool, DType, int>;  // paged, dtype, splits

class GpuNonFiniteKv : public ::testing::TestWithParam<KvParam> {};

TEST_P(GpuNonFiniteKv, DecodeFollowsTheRule) {
  FL_SKIP_WITHOUT_GPU();
  const auto [paged, dtype, splits] = GetParam();
  kvtest::HostCache cache(kv_cache_spec(paged, dtype), seed_of("nonfinite kv"));
  kvtest::DecodeProblem p(cache, kv_decode_spec(), seed_of("nonfinite kv q"));
  std::string kernel;
  const auto run = [&] {
    kv_fill_outputs(p);
    kernel = decode_on_device(p, splits);
    return kv_read_outputs(p);
  };
  const Outputs clean = run();
  SCOPED_TRACE("kernel " + kernel);
  for (const KvPoison& z : kv_poisons()) {
    SCOPED_TRACE(z.name);
    const float old = kv_put(p, z, z.value);
    kv_check(p, z, clean, run(), /*masked_v_leaks=*/true);
    kv_put(p, z, old);
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuNonFiniteKv,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(1, 4)),
                         [](const ::testing::TestParamInfo<KvParam>& info) {
                           return std::string(std::get<0>(info.param) ? "paged_" : "contiguous_") +
                                  dtype_tag(std::get<1>(info.param)) + "_splits" + std::to_string(std::get<2>(info.param));
                         });

// ---- Long rows: uniform attention over 2^22 + 7 keys (2^16 + 7 too). The bound is the output's own rounding: 1e-5
// for fp32 (measured on the CPU backends: 2.4e-8), 2 units of fp16 / bf16 rounding (2^-10, 2^-7) for the 16-bit
// outputs. The tensor-core kernels pass only by folding O out of their accumulators every kFoldKeys keys (without
// it: 2.4e-2 over 2^22 keys on the H100, both 16-bit types).

double long_row_bound(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 1.0 / 1024 : 1.0 / 128; }

struct DevBuffer {
  Buffer& host;
  void* p = nullptr;
  explicit DevBuffer(Buffer& b) : host(b) {
    ck(cudaMalloc(&p, b.bytes.size()), "cudaMalloc");
    ck(cudaMemcpy(p, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice), "H2D");
  }
  DevBuffer(const DevBuffer&) = delete;
  DevBuffer& operator=(const DevBuffer&) = delete;
  ~DevBuffer() { cudaFree(p); }
  void down() { ck(cudaMemcpy(host.bytes.data(), p, host.bytes.size(), cudaMemcpyDeviceToHost), "D2H"); }
};

using LongParam = std::tuple<int64_t, DType, Backend, int, int>;  // rows, dtype, backend, log2 of the keys (+ 7), D

class GpuLongRows : public ::testing::TestWithParam<LongParam> {};

TEST_P(GpuLongRows, StayNearOutputRounding) {
  FL_SKIP_WITHOUT_GPU();
  const auto [rows, dtype, backend, log2_keys, head_dim] = GetParam();
  LongRow r(rows, (int64_t(1) << log2_keys) + 7, head_dim, rows > 1, dtype, /*broadcast_k=*/false);
  DevBuffer q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse);
  ForwardArgs a = r.args;
  a.q = on_device(a.q, q.p), a.k = on_device(a.k, k.p), a.v = on_device(a.v, v.p);
  a.out = on_device(a.out, out.p), a.lse = on_device(a.lse, lse.p);
  a.backend = backend;
  const std::string kernel = fltest::suite_forward_kernel_name(a);
  fltest::suite_forward(a);
  ck(cudaDeviceSynchronize(), "forward");
  out.down();
  lse.down();
  const auto [out_err, lse_err] = r.errors(r.out.bytes.data(), r.lse.bytes.data());
  EXPECT_LT(out_err, long_row_bound(dtype)) << kernel << ": ||out - mean V|| / ||mean V|| over " << r.n << " keys";
  EXPECT_LT(lse_err, 1e-5) << kernel << ": LSE vs score + log(keys)";
  std::printf("  %s: out error %.3g, lse error %.3g\n", kernel.c_str(), out_err, lse_err);
}

// Names end in _cuda for the tensor-core cases, so that the --no-hopper re-run takes them too (D64: mma.sync).
INSTANTIATE_TEST_SUITE_P(Keys4M, GpuLongRows,
                         ::testing::Values(LongParam{1, DType::f32, Backend::cuda, 22, 32},
                                           LongParam{9, DType::f32, Backend::cuda, 22, 32},
                                           LongParam{1, DType::f16, Backend::cuda, 22, 32},
                                           LongParam{9, DType::f16, Backend::cuda, 22, 32},
                                           LongParam{1, DType::bf16, Backend::cuda, 22, 32},
                                           LongParam{1, DType::f16, Backend::cuda, 22, 64},
                                           LongParam{9, DType::bf16, Backend::cuda, 22, 64},
                                           LongParam{1, DType::f16, Backend::cuda, 16, 32},
                                           LongParam{9, DType::f16, Backend::cuda, 16, 32},
                                           LongParam{1, DType::bf16, Backend::cuda, 16, 32},
                                           LongParam{1, DType::f32, Backend::naive, 22, 32}),
                         [](const ::testing::TestParamInfo<LongParam>& info) {
                           const LongParam& c = info.param;  // (no structured binding: commas in a macro)
                           return (std::get<0>(c) == 1 ? std::string("onerow_") : "causal9rows_") +
                                  dtype_tag(std::get<1>(c)) + "_d" + std::to_string(std::get<4>(c)) + "_2p" +
                                  std::to_string(std::get<3>(c)) + "_" + flashlite::backend_name(std::get<2>(c));
                         });

// ---- Folded rows against the float64 reference: random q, k, v over 3 * 2^15 + 77 keys whose scores grow along the
// row (key j scaled by 1 + 2j / n), so the running max rises after every fold and the folded sums must be rescaled;
// sink logits, a causal and a windowed case, a ragged (varlen) batch; fp16 / bf16; head_dim 32 (mma.sync), 64 and
// 128 (Hopper on sm_90; mma.sync in the --no-hopper re-run); 9 rows, 200 at D64 full. Bound: 2^-9 (fp16) or 2^-6
// (bf16) of the row's largest |out|, the 16-bit rounding of O plus P's rounding; a fold that dropped or mis-scaled a
// segment is off by far more.
// Also the workspace contract: forward_workspace_bytes() sizes the fold space, a caller's workspace of that size
// gives bitwise the same output, a smaller one is refused by name.
using FoldParam = std::tuple<DType, int, int>;  // dtype, head_dim, mask case (0 full + sinks, 1 causal, 2 window, 3 varlen)

class GpuFoldedRows : public ::testing::TestWithParam<FoldParam> {};

TEST_P(GpuFoldedRows, MatchTheFloat64Reference) {
  FL_SKIP_WITHOUT_GPU();
  const auto [dtype, d, mask_case] = GetParam();
  // D64 full + sinks takes the Hopper kernel's three consumer warpgroups (192-row tiles): 200 rows give each of them
  // rows to fold, and a second tile.
  const int64_t n = 3 * (int64_t(1) << 15) + 77, heads = 2;
  const int64_t rows = mask_case == 3 ? 2 * 5 : mask_case == 0 && d == 64 ? 200 : 9;
  const int64_t keys = mask_case == 3 ? 2 * n : n;  // varlen: two sequences of n keys and 5 queries each
  std::mt19937_64 rng(seed_of("folded rows " + std::to_string(d) + dtype_tag(dtype) + std::to_string(mask_case)));
  std::normal_distribution<float> normal(0.f, 1.f);
  Buffer qb(dtype, rows * heads * d), kb(dtype, keys * heads * d), vb(dtype, keys * heads * d);
  Buffer ob(dtype, rows * heads * d), lb(DType::f32, heads * rows);
  for (int64_t i = 0; i < qb.numel(); ++i) store(dtype, qb.data(), i, normal(rng));
  for (int64_t j = 0; j < keys; ++j) {
    const float grow = 1.f + 2.f * float(j % n) / float(n);
    for (int64_t c = 0; c < heads * d; ++c) {
      store(dtype, kb.data(), j * heads * d + c, normal(rng) * grow);
      store(dtype, vb.data(), j * heads * d + c, normal(rng));
    }
  }
  std::vector<float> sinks{0.5f, -1.f};
  std::vector<int32_t> cu_q{0, 5, 10}, cu_k{0, int32_t(n), int32_t(2 * n)};
  ForwardArgs a;
  a.q = view_n(qb.data(), dtype, {1, rows, heads, d}, {rows * heads * d, heads * d, d, 1});
  a.k = view_n(kb.data(), dtype, {1, keys, heads, d}, {keys * heads * d, heads * d, d, 1});
  a.v = view_n(vb.data(), dtype, {1, keys, heads, d}, {keys * heads * d, heads * d, d, 1});
  a.out = view_n(ob.data(), dtype, {1, rows, heads, d}, {rows * heads * d, heads * d, d, 1});
  a.lse = view_n(lb.data(), DType::f32, {1, heads, rows}, {heads * rows, rows, 1});
  if (mask_case == 0) a.options.sink_logits = view_n(sinks.data(), DType::f32, {heads}, {1});
  if (mask_case == 1) a.options.causal = true;
  if (mask_case == 2) a.options.causal = true, a.options.window_left = 40000, a.options.sink_tokens = 4;
  if (mask_case == 3) {
    a.options.cu_seqlens_q = view_n(cu_q.data(), DType::i32, {3}, {1});
    a.options.cu_seqlens_k = view_n(cu_k.data(), DType::i32, {3}, {1});
    a.options.causal = true;
  }
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.options.sink_logits, &a.options.cu_seqlens_q,
                        &a.options.cu_seqlens_k}) {
    t->device = Device::cpu();
  }
  std::vector<double> want_out(size_t(rows * heads * d)), want_lse(size_t(heads * rows));
  flashlite::reference_forward_f64(a, want_out.data(), want_lse.data());

  Buffer sinks_b(DType::f32, heads);
  std::memcpy(sinks_b.data(), sinks.data(), sinks.size() * sizeof(float));
  DevBuffer q(qb), k(kb), v(vb), out(ob), lse(lb), sink(sinks_b);
  a.q = on_device(a.q, q.p), a.k = on_device(a.k, k.p), a.v = on_device(a.v, v.p);
  a.out = on_device(a.out, out.p), a.lse = on_device(a.lse, lse.p);
  if (mask_case == 0) a.options.sink_logits = on_device(a.options.sink_logits, sink.p);
  a.backend = Backend::cuda;
  const std::string kernel = fltest::suite_forward_kernel_name(a);
  const flashlite::ForwardPlan plan = fltest::suite_forward_plan(a);
  ASSERT_GT(plan.workspace_bytes, size_t(0)) << kernel << ": rows of " << n << " keys need fold space";
  fltest::suite_forward(a);  // fold space allocated by the call
  ck(cudaDeviceSynchronize(), "forward");
  out.down();
  lse.down();
  const double bound = dtype == DType::f16 ? 1.0 / 512 : 1.0 / 64;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      double peak = 0, err = 0;
      for (int64_t c = 0; c < d; ++c) {
        const size_t e = size_t((i * heads + h) * d + c);
        peak = std::max(peak, std::fabs(want_out[e]));
        err = std::max(err, std::fabs(double(load(dtype, ob.data(), int64_t(e))) - want_out[e]));
      }
      ASSERT_LE(err, bound * peak) << kernel << ": row " << i << " head " << h;
      const double wl = want_lse[size_t(h * rows + i)], gl = load(DType::f32, lb.data(), h * rows + i);
      ASSERT_LE(std::fabs(gl - wl), 1e-4 * std::max(1.0, std::fabs(wl))) << kernel << ": LSE row " << i << " head " << h;
    }

  // The caller's workspace: the same bytes out; one byte short is refused.
  std::vector<uint8_t> first(ob.bytes);
  void* ws = nullptr;
  ck(cudaMalloc(&ws, plan.workspace_bytes), "cudaMalloc workspace");
  ck(cudaMemset(ws, 0xff, plan.workspace_bytes), "poisoning the workspace");  // NaN: stale contents must not matter
  ck(cudaMemset(out.p, 0xff, ob.bytes.size()), "poisoning out");
  a.workspace = ws;
  a.workspace_bytes = plan.workspace_bytes;
  {
    flashlite::ForwardArgs planned = a;  // the size of the kernel the suite runs (--no-hopper: the mma.sync kernel's)
    planned.plan = &plan;
    EXPECT_EQ(flashlite::forward_workspace_bytes(planned), plan.workspace_bytes);
  }
  fltest::suite_forward(a);
  ck(cudaDeviceSynchronize(), "forward with a workspace");
  out.down();
  EXPECT_EQ(first, ob.bytes) << kernel << ": a caller's workspace changed the output";
  a.workspace_bytes = plan.workspace_bytes - 1;
  try {
    fltest::suite_forward(a);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward_workspace_bytes"), std::string::npos) << e.what();
  }
  cudaFree(ws);
}

const char* fold_mask_name(int mask_case) {
  return mask_case == 0 ? "sinks" : mask_case == 1 ? "causal" : mask_case == 2 ? "window" : "varlen";
}

INSTANTIATE_TEST_SUITE_P(Keys98k, GpuFoldedRows,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16), ::testing::Values(32, 64, 128),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const ::testing::TestParamInfo<FoldParam>& info) {
                           return std::string(fold_mask_name(std::get<2>(info.param))) + "_" +
                                  dtype_tag(std::get<0>(info.param)) + "_d" + std::to_string(std::get<1>(info.param)) +
                                  "_cuda";
                         });

// The decode kernel over a cache of 2^22 + 7 tokens (fp16, head_dim 64, one query, the plan's splits).
TEST(GpuLongRowsDecode, StayNearOutputRounding) {
  FL_SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t(1) << 22) + 7, d = 64;
  LongRow r(1, n, d, false, DType::f16, /*broadcast_k=*/false);
  std::vector<int32_t> lens{int32_t(n)};
  DevBuffer q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse);
  DevBytes lens_d(lens);
  flashlite::DecodeArgs a;
  a.cache.layout = flashlite::KvLayout::contiguous;
  a.cache.k = on_device(view_n(r.k.data(), DType::f16, {1, n, 1, d}, {n * d, d, d, 1}), k.p);
  a.cache.v = on_device(view_n(r.v.data(), DType::f16, {1, n, 1, d}, {n * d, d, d, 1}), v.p);
  a.cache.host.seq_lens = view_n(lens.data(), DType::i32, {1}, {1});
  a.cache.device.seq_lens = on_device(a.cache.host.seq_lens, lens_d.p);
  a.q = on_device(r.args.q, q.p);
  a.out = on_device(r.args.out, out.p);
  a.lse = on_device(r.args.lse, lse.p);
  a.backend = Backend::cuda;
  const std::string kernel = fltest::suite_decode_kernel_name(a);
  fltest::suite_decode(a);
  ck(cudaDeviceSynchronize(), "decode");
  out.down();
  lse.down();
  const auto [out_err, lse_err] = r.errors(r.out.bytes.data(), r.lse.bytes.data());
  EXPECT_LT(out_err, long_row_bound(DType::f16)) << kernel;
  EXPECT_LT(lse_err, 1e-5) << kernel;
  std::printf("  %s: out error %.3g, lse error %.3g\n", kernel.c_str(), out_err, lse_err);
}

}  // namespace
}  // namespace fltest::nonfinite
