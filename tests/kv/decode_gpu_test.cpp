// The CUDA KV-cache kernels against float64 (skipped without a GPU): split-KV decode over contiguous and paged
// caches (random page tables, page sizes 16..256, ragged lengths 1..65536, page boundaries, windows crossing pages,
// sinks, GQA 1/3/4/8/16, q_len 1..8, forced split counts), the fused append + RoPE, append-then-decode against
// attention over the concatenation, a decode step captured once in a CUDA graph and replayed as lengths grow, and split
// decodes repeated across calls and graph replays on one workspace.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kv/kv_backends.h"
#include "kv_gpu_util.h"
#include "test_overrides.h"
#include "kv_test_util.h"

namespace kvtest {
namespace {

using flashlite::AppendArgs;
using flashlite::RopeLayout;

TensorView on_device(TensorView t, void* dev_data) {
  t.data = dev_data;
  t.device = Device::cuda(0);
  return t;
}

// The cache on the device: K/V bytes, and the index twice (host arrays of the HostCache, device copies).
struct DeviceCache {
  HostCache& host;
  DevBuf k, v, seq_lens, indptr, indices, last;
  KvCacheView view;
  explicit DeviceCache(HostCache& c)
      : host(c),
        k(c.kbuf.bytes.data(), c.kbuf.bytes.size()),
        v(c.vbuf.bytes.data(), c.vbuf.bytes.size()),
        seq_lens(c.seq_lens.data(), c.seq_lens.size() * 4),
        indptr(c.indptr.data(), c.indptr.size() * 4),
        indices(c.indices.data(), c.indices.size() * 4),
        last(c.last.data(), c.last.size() * 4) {
    view = c.view;
    view.k = on_device(c.view.k, k.p);
    view.v = on_device(c.view.v, v.p);
    if (!c.spec.paged) {
      view.device.seq_lens = on_device(c.view.host.seq_lens, seq_lens.p);
    } else {
      view.device.page_indptr = on_device(c.view.host.page_indptr, indptr.p);
      view.device.page_indices = on_device(c.view.host.page_indices, indices.p);
      view.device.last_page_len = on_device(c.view.host.last_page_len, last.p);
    }
  }
  void upload_index() {
    if (!host.spec.paged) {
      seq_lens.up(host.seq_lens.data());
    } else {
      indptr.up(host.indptr.data()), indices.up(host.indices.data()), last.up(host.last.data());
    }
  }
  void download_kv() {
    k.down(host.kbuf.data());
    v.down(host.vbuf.data());
  }
};

// Device copies of a decode problem's q / out / lse / sink logits; args re-pointed at them and at the device cache.
struct DeviceDecode {
  DecodeProblem& p;
  DevBuf q, out, lse, sink;
  DecodeArgs args;
  DeviceDecode(DecodeProblem& prob, DeviceCache& dc)
      : p(prob),
        q(prob.qbuf.bytes.data(), prob.qbuf.bytes.size()),
        out(prob.outbuf.bytes.data(), prob.outbuf.bytes.size()),
        lse(prob.lsebuf.bytes.data(), prob.lsebuf.bytes.size()),
        sink(prob.sinkbuf.bytes.data(), prob.sinkbuf.bytes.size()) {
    args = prob.args;
    args.cache = dc.view;
    args.q = on_device(prob.args.q, q.p);
    args.out = on_device(prob.args.out, out.p);
    if (prob.args.lse.data) args.lse = on_device(prob.args.lse, lse.p);
    if (prob.spec.sink_logits) args.options.sink_logits = on_device(prob.args.options.sink_logits, sink.p);
    args.backend = Backend::cuda;
  }
  void download() {
    ck(cudaDeviceSynchronize(), "kernel execution");
    out.down(p.outbuf.data());
    if (p.args.lse.data) lse.down(p.lsebuf.data());
  }
};

// ------------------------------------------------------------------------------------------------ decode grid

struct GpuCase {
  std::string name;
  CacheSpec cache;
  DecodeSpec dec;
  int splits = 0;        // 0: planned
  bool cluster = false;  // splits chosen at run time: the most a one-block-per-SM grid allows (the cluster merge)
};

// Whether split decodes merge in a cluster here: sm_90+ and not the --combine re-run (the kernels are built for
// sm_90a in the device builds this suite runs in).
bool cluster_merge_on() {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  return major >= 9 && !fltest::suite_overrides().combine;
}

int sm_count() {
  int sms = 0;
  return cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess ? sms : 0;
}

// Whether a split kernel reading `kv_bytes` of K/V copies it with the L2 evict-first policy (the plan,
// src/kv/kv_plan.cpp): at least half the L2.
bool expect_kv_evict_first(int64_t kv_bytes) {
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) != cudaSuccess || l2 <= 0) l2 = 1;
  return 2 * kv_bytes >= int64_t(l2);
}

std::vector<GpuCase> gpu_cases() {
  std::vector<GpuCase> v;
  const std::vector<int32_t> ragged = {1, 17, 64, 65, 1000, 4097};
  const std::vector<std::pair<int, int>> gqa = {{8, 8}, {16, 4}, {32, 4}, {12, 4}};
  const std::vector<int> q_lens = {1, 2, 5, 8};
  int n = 0;
  for (int64_t page : {0, 16, 64, 256})
    for (DType t : {DType::bf16, DType::f16})
      for (int64_t d : {64, 128}) {
        GpuCase c;
        c.cache.paged = page > 0;
        c.cache.page_size = page > 0 ? page : 16;
        c.cache.dtype = t;
        c.cache.head_dim = d;
        c.cache.lens = ragged;
        c.cache.padded = n % 3 == 2;
        const auto [hq, hkv] = gqa[size_t(n % 4)];
        c.cache.kv_heads = hkv;
        c.dec.q_heads = hq;
        c.dec.q_len = q_lens[size_t((n / 2) % 4)];
        c.dec.opt.causal = true;
        c.dec.padded_out = n % 5 == 1;
        c.name = std::string(page ? "paged" + std::to_string(page) : "contig") + "_" + flashlite::dtype_name(t) + "_d" +
                 std::to_string(d) + "_hq" + std::to_string(hq) + "_hkv" + std::to_string(hkv) + "_q" +
                 std::to_string(c.dec.q_len) + (c.cache.padded ? "_padded" : "");
        v.push_back(c);
        // The same with the most splits a one-block-per-SM grid allows (the merge in a cluster on sm_90).
        c.cluster = true;
        c.name += "_cluster";
        v.push_back(c);
        ++n;
      }
  auto masked = [&](std::string name, auto edit) {
    GpuCase c;
    c.cache.paged = true;
    c.cache.page_size = 16;
    c.cache.kv_heads = 4;
    c.cache.head_dim = 128;
    c.cache.dtype = DType::bf16;
    c.cache.lens = {7, 130, 1000, 3000};
    c.dec.q_heads = 16;
    c.dec.q_len = 3;
    c.dec.opt.causal = true;
    edit(c);
    c.name = name;
    v.push_back(c);
  };
  masked("window_crossing_pages", [](GpuCase& c) { c.dec.opt.window_left = 100; });
  masked("window_sinks", [](GpuCase& c) { c.dec.opt.window_left = 100, c.dec.opt.sink_tokens = 4; });
  masked("window_sinks_overlap", [](GpuCase& c) { c.dec.opt.window_left = 30, c.dec.opt.sink_tokens = 120; });
  masked("window_sinks_contig_f16", [](GpuCase& c) {
    c.cache.paged = false, c.cache.dtype = DType::f16, c.dec.opt.window_left = 500, c.dec.opt.sink_tokens = 70;
  });
  masked("sink_logits", [](GpuCase& c) { c.dec.sink_logits = true; });
  masked("sink_logits_window", [](GpuCase& c) { c.dec.sink_logits = true, c.dec.opt.window_left = 50, c.dec.opt.sink_tokens = 2; });
  masked("softcap_scale", [](GpuCase& c) { c.dec.opt.softcap = 4.0, c.dec.opt.scale = 0.2; });
  masked("not_causal_q4", [](GpuCase& c) { c.dec.opt.causal = false, c.dec.q_len = 4; });
  masked("window_right", [](GpuCase& c) { c.dec.opt.causal = false, c.dec.opt.window_left = 9, c.dec.opt.window_right = 3; });
  masked("q8_short_rows_masked", [](GpuCase& c) { c.cache.lens = {3, 1, 8, 9}, c.dec.q_len = 8; });
  masked("q8_short_sink_logits", [](GpuCase& c) { c.cache.lens = {3, 1, 8, 9}, c.dec.q_len = 8, c.dec.sink_logits = true; });
  masked("group8_q8_64rows", [](GpuCase& c) { c.cache.kv_heads = 2, c.dec.q_len = 8; });
  masked("group16_q8_two_row_chunks", [](GpuCase& c) { c.cache.kv_heads = 2, c.dec.q_heads = 32, c.dec.q_len = 8; });
  masked("group16_q5_two_row_chunks", [](GpuCase& c) { c.cache.kv_heads = 1, c.dec.q_heads = 16, c.dec.q_len = 5; });
  masked("empty_sequences", [](GpuCase& c) { c.cache.lens = {0, 300, 0, 16}; });
  masked("no_lse", [](GpuCase& c) { c.dec.lse = false; });
  for (int s : {1, 3, 17, 64, 256}) {
    masked("splits" + std::to_string(s), [s](GpuCase& c) { c.cache.lens = {5000, 3, 700, 1}, c.dec.opt.causal = false, c.dec.q_len = 1; });
    v.back().splits = s;
  }
  masked("splits40_window_sinks_softcap_sinklogits", [](GpuCase& c) {
    c.dec.opt.window_left = 333, c.dec.opt.sink_tokens = 5, c.dec.opt.softcap = 10, c.dec.sink_logits = true;
  });
  v.back().splits = 40;
  // Long sequences (Llama-3-8B decode shape): 65536 tokens next to 1.
  for (int64_t page : {0, 16}) {
    masked(std::string("long65536_") + (page ? "paged16" : "contig"), [page](GpuCase& c) {
      c.cache.paged = page > 0, c.cache.kv_heads = 8, c.dec.q_heads = 32, c.dec.q_len = 1;
      c.cache.lens = {65536, 1, 20000};
    });
  }
  // Page sizes that are not powers of two (divide instead of shift), pages crossed by the window and the sinks.
  masked("paged48_window_sinks", [](GpuCase& c) { c.cache.page_size = 48, c.dec.opt.window_left = 100, c.dec.opt.sink_tokens = 5; });
  masked("paged17_splits17", [](GpuCase& c) { c.cache.page_size = 17, c.cache.lens = {5000, 3, 700, 1}, c.dec.q_len = 1; });
  v.back().splits = 17;
  masked("long65536_paged256_q4", [](GpuCase& c) {
    c.cache.page_size = 256, c.cache.kv_heads = 8, c.dec.q_heads = 32, c.dec.q_len = 4, c.cache.lens = {65536, 33};
  });
  // The masks' edge cases again through the cluster merge (their planned splits give two blocks per SM: combine).
  const size_t n_cases = v.size();
  for (size_t i = 0; i < n_cases; ++i) {
    for (const char* name : {"window_sinks", "window_right", "sink_logits_window", "softcap_scale", "empty_sequences",
                             "q8_short_sink_logits", "group16_q8_two_row_chunks", "group16_q5_two_row_chunks",
                             "paged48_window_sinks", "window_sinks_contig_f16"}) {
      if (v[i].name != name) continue;
      GpuCase c = v[i];
      c.cluster = true;
      c.name += "_cluster";
      v.push_back(c);
    }
  }
  return v;
}

void run_grid_case(const GpuCase& tc) {
  HostCache cache(tc.cache, fltest::seed_of(tc.name));
  DecodeProblem p(cache, tc.dec, fltest::seed_of(tc.name + "q"));
  const std::vector<uint8_t> out_before = p.outbuf.bytes, k_before = cache.kbuf.bytes;
  DeviceCache dc(cache);
  DeviceDecode dd(p, dc);
  int splits = tc.splits;
  bool expect_cluster = false;
  if (tc.cluster) {
    const int64_t rows = tc.dec.q_heads / tc.cache.kv_heads * tc.dec.q_len;
    const int64_t units = cache.batch * tc.cache.kv_heads * ((rows + 63) / 64);
    splits = int(std::clamp<int64_t>(sm_count() / units, 2, 16));
    expect_cluster = cluster_merge_on() && units * splits <= sm_count();
  }
  const flashlite::DecodePlan plan = fltest::suite_plan_decode(dd.args, -1, splits);  // under the suite's merge
  dd.args.plan = &plan;
  const std::string name = fltest::suite_decode_kernel_name(dd.args);
  if (tc.cluster) {
    EXPECT_EQ(name.find("cluster merge") != std::string::npos, expect_cluster) << name;
  }
  fltest::suite_decode(dd.args);
  dd.download();
  expect_decode_matches(p, out_before);
  dc.download_kv();
  EXPECT_TRUE(cache.kbuf.bytes == k_before) << "decode wrote to the cache";
  std::printf("  kernel: %s\n", name.c_str());
}

class GpuDecode : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuDecode, MatchesFloat64Reference) {
  SKIP_WITHOUT_GPU();
  run_grid_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Kv, GpuDecode, ::testing::ValuesIn(gpu_cases()), [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------------------------------ append

std::vector<AppendCase> gpu_append_cases() {
  std::vector<AppendCase> v;
  for (bool paged : {false, true})
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      const std::string base = std::string(paged ? "paged" : "contig") + "_" + flashlite::dtype_name(t);
      v.push_back({base + "_plain_n1", paged, t, 1, false});
      v.push_back({base + "_rope_half_n1_q", paged, t, 1, true, RopeLayout::half_split, false, true});
      v.push_back({base + "_rope_interleaved_n5_q_inplace", paged, t, 5, true, RopeLayout::interleaved, false, true, true});
      v.push_back({base + "_rope_llama3_n17_q", paged, t, 17, true, RopeLayout::half_split, true, true});
    }
  return v;
}

class GpuAppend : public ::testing::TestWithParam<AppendCase> {};

TEST_P(GpuAppend, WritesRotatedTokensAndNothingElse) {
  SKIP_WITHOUT_GPU();
  const AppendCase& tc = GetParam();
  HostCache cache(append_cache(tc), fltest::seed_of(tc.name));
  AppendFixture f(cache, tc);
  const auto k_before = cache.kbuf.bytes, v_before = cache.vbuf.bytes, q_before = f.q.bytes;
  DeviceCache dc(cache);
  DevBuf k(f.k.bytes.data(), f.k.bytes.size()), v(f.v.bytes.data(), f.v.bytes.size());
  DevBuf q(f.q.bytes.data(), f.q.bytes.size()), qo(f.q_out.bytes.data(), f.q_out.bytes.size());
  AppendArgs a = f.args;
  a.cache = dc.view;
  a.k = on_device(f.args.k, k.p);
  a.v = on_device(f.args.v, v.p);
  if (tc.q) {
    a.q = on_device(f.args.q, q.p);
    a.q_out = tc.in_place ? a.q : on_device(f.args.q_out, qo.p);
  }
  a.backend = Backend::cuda;
  flashlite::append_kv(a);
  ck(cudaDeviceSynchronize(), "append");
  dc.download_kv();
  if (tc.q) (tc.in_place ? q : qo).down(tc.in_place ? f.q.data() : f.q_out.data());
  f.check(k_before, v_before, q_before);
}

INSTANTIATE_TEST_SUITE_P(Kv, GpuAppend, ::testing::ValuesIn(gpu_append_cases()), [](const auto& info) { return info.param.name; });

// Append (RoPE) then decode on the GPU equals the oracle over a cache built on the host from the old tokens and the
// new ones rotated in float64 (the concatenation), for both layouts.
TEST(GpuKv, AppendThenDecodeEqualsAttentionOverConcatenation) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    AppendCase tc{"gpu_concat", paged, DType::bf16, 1, true, RopeLayout::half_split, true, true};
    CacheSpec cs = append_cache(tc);
    cs.head_dim = 128;
    cs.kv_heads = 2;
    HostCache cache(cs, fltest::seed_of("gpu_concat"));
    HostCache expected(cs, fltest::seed_of("gpu_concat"));  // same values; gets the new tokens from float64 RoPE
    AppendFixture f(cache, tc);
    const int64_t H = cs.kv_heads, D = cs.head_dim;
    for (int64_t b = 0; b < cache.batch; ++b) {
      const int64_t pos = cache.len(b) - 1;
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> kr(static_cast<size_t>(D));
        for (int64_t c = 0; c < D; ++c) kr[size_t(c)] = fltest::load(DType::bf16, f.k.bytes.data(), (b * H + h) * D + c);
        kr = test_rope(f.args.rope, kr, pos);
        for (int64_t c = 0; c < D; ++c) {
          fltest::store(DType::bf16, expected.kbuf.data(), expected.offset(b, pos, h) + c, float(kr[size_t(c)]));
          fltest::store(DType::bf16, expected.vbuf.data(), expected.offset(b, pos, h) + c,
                        fltest::load(DType::bf16, f.v.bytes.data(), (b * H + h) * D + c));
        }
      }
    }
    DeviceCache dc(cache);
    DevBuf k(f.k.bytes.data(), f.k.bytes.size()), v(f.v.bytes.data(), f.v.bytes.size());
    AppendArgs a = f.args;
    a.q = a.q_out = TensorView{};
    a.cache = dc.view;
    a.k = on_device(f.args.k, k.p);
    a.v = on_device(f.args.v, v.p);
    flashlite::append_kv(a);
    DecodeSpec ds;
    ds.q_heads = 8;
    DecodeProblem p(cache, ds, fltest::seed_of("gpu_concat q"));
    DecodeProblem pe(expected, ds, fltest::seed_of("gpu_concat q"));  // same q
    DeviceDecode dd(p, dc);
    fltest::suite_decode(dd.args);
    dd.download();
    const std::vector<uint8_t> out_before = pe.outbuf.bytes;
    pe.outbuf.bytes = p.outbuf.bytes;
    pe.lsebuf.bytes = p.lsebuf.bytes;
    expect_decode_matches(pe, out_before);
  }
}

// ------------------------------------------------------------------------------------------------ CUDA graph

// One decode step (append 1 token with RoPE + decode) captured once with a plan for the whole capacity, replayed
// twice while the lengths grow (host and device index updated between replays, new K/V written into the same
// device buffers): the kernels read the current lengths, so both steps land and the second decode is exact.
TEST(GpuKv, DecodeStepCapturedInGraphReplaysAsLengthsGrow) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    CacheSpec cs;
    cs.paged = paged;
    cs.page_size = 16;
    cs.kv_heads = 8;
    cs.head_dim = 128;
    cs.dtype = DType::bf16;
    cs.lens = {4000, 35, 1027, 18};  // final lengths (after two steps); last pages hold >= 2 tokens
    cs.max_len = 4096;
    for (int32_t l : cs.lens) cs.filled.push_back(l - 2);
    HostCache cache(cs, fltest::seed_of("graph"));
    // Step 1 state: one token less.
    if (!paged) {
      for (auto& l : cache.seq_lens) l -= 1;
    } else {
      for (auto& l : cache.last) l -= 1;
    }
    DecodeSpec ds;
    ds.q_heads = 32;
    DecodeProblem p(cache, ds, fltest::seed_of("graph q"));
    DeviceCache dc(cache);
    DeviceDecode dd(p, dc);
    AppendCase tc{"graph_new", paged, DType::bf16, 1, true, RopeLayout::half_split, true, false};
    AppendFixture f1(cache, tc);
    tc.name = "graph_new2";
    AppendFixture f2(cache, tc);
    DevBuf k(f1.k.bytes.data(), f1.k.bytes.size()), v(f1.v.bytes.data(), f1.v.bytes.size());
    AppendArgs a = f1.args;
    a.cache = dc.view;
    a.k = on_device(f1.args.k, k.p);
    a.v = on_device(f1.args.v, v.p);
    const flashlite::DecodePlan plan = fltest::suite_plan_decode(dd.args, 4096);  // the capacity: valid for every step
    EXPECT_GT(plan.num_splits, 1);
    DevBuf ws(nullptr, 0);
    ck(cudaMalloc(&ws.p, std::max<size_t>(plan.workspace_bytes, 16)), "workspace");
    dd.args.plan = &plan;
    dd.args.workspace = ws.p;
    dd.args.workspace_bytes = plan.workspace_bytes;
    cudaStream_t stream;
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    a.stream = dd.args.stream = stream;
    cudaGraph_t graph;
    ck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    flashlite::append_kv(a);
    fltest::suite_decode(dd.args);
    ck(cudaStreamEndCapture(stream, &graph), "end capture (append + decode must not sync or allocate)");
    cudaGraphExec_t exec;
    ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    ck(cudaGraphLaunch(exec, stream), "replay 1");
    ck(cudaStreamSynchronize(stream), "replay 1");
    // Step 2: lengths + 1, the second token's K/V in the same buffers.
    if (!paged) {
      for (auto& l : cache.seq_lens) l += 1;
    } else {
      for (auto& l : cache.last) l += 1;
    }
    dc.upload_index();
    k.up(f2.k.bytes.data());
    v.up(f2.v.bytes.data());
    ck(cudaGraphLaunch(exec, stream), "replay 2");
    ck(cudaStreamSynchronize(stream), "replay 2");
    dd.download();
    dc.download_kv();
    // Both appended tokens are in place (float64 RoPE at their positions) ...
    int64_t bad = 0;
    for (int64_t b = 0; b < cache.batch; ++b)
      for (int step = 0; step < 2; ++step) {
        const AppendFixture& f = step == 0 ? f1 : f2;
        const int64_t pos = cache.len(b) - 2 + step;
        for (int64_t h = 0; h < cs.kv_heads; ++h) {
          std::vector<double> kr(static_cast<size_t>(cs.head_dim));
          for (int64_t c = 0; c < cs.head_dim; ++c) kr[size_t(c)] = fltest::load(DType::bf16, f.k.bytes.data(), (b * cs.kv_heads + h) * cs.head_dim + c);
          kr = test_rope(f.args.rope, kr, pos);
          for (int64_t c = 0; c < cs.head_dim; ++c) {
            if (!(std::fabs(cache.k_at(b, pos, h, c) - kr[size_t(c)]) <= stored_tol(DType::bf16, kr[size_t(c)]))) ++bad;
          }
        }
      }
    EXPECT_EQ(bad, 0) << "appended keys differ from float64 RoPE";
    // ... and the second decode attends over the grown cache.
    Buffer poisoned(DType::bf16, p.outbuf.numel());
    poisoned.poison();
    expect_decode_matches(p, poisoned.bytes);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// Split decodes and their merge, called again and again on one workspace: many splits (256: more blocks than one
// wave; 64 with q_len 5 and a window over pages; 3-4 long splits), repeated eager calls on one workspace filled with
// garbage first (every partial is written before it is read), a workspace decode allocates itself, and a graph of two
// calls replayed three times. The output is poisoned before every call, so a merge that did not run leaves NaN and
// one that read stale partials gives a wrong answer.
TEST(GpuKv, SplitMergeRepeatsAcrossCallsAndGraphReplays) {
  SKIP_WITHOUT_GPU();
  struct Cfg {
    const char* name;
    bool paged;
    int64_t q_len;
    int splits;
    bool window;
  };
  for (const Cfg& cfg : {Cfg{"contig_splits256", false, 1, 256, false}, Cfg{"paged16_q5_splits64_window", true, 5, 64, true},
                         Cfg{"contig_q2_splits3", false, 2, 3, false}, Cfg{"planned", false, 1, 0, false},
                         Cfg{"contig_splits4", false, 1, 4, false}, Cfg{"paged16_q3_splits3_window", true, 3, 3, true}}) {
    SCOPED_TRACE(cfg.name);
    CacheSpec cs;
    cs.paged = cfg.paged;
    cs.page_size = 16;
    cs.kv_heads = 8;
    cs.head_dim = 128;
    cs.dtype = DType::bf16;
    cs.lens = {5000, 3, 700, 1};
    HostCache cache(cs, fltest::seed_of(cfg.name));
    DecodeSpec ds;
    ds.q_heads = 32;
    ds.q_len = cfg.q_len;
    ds.opt.causal = true;
    if (cfg.window) ds.opt.window_left = cfg.splits == 3 ? 2000 : 300, ds.opt.sink_tokens = 3, ds.sink_logits = true;
    DecodeProblem p(cache, ds, fltest::seed_of(std::string(cfg.name) + "q"));
    const std::vector<uint8_t> poisoned_out = p.outbuf.bytes, poisoned_lse = p.lsebuf.bytes;
    DeviceCache dc(cache);
    DeviceDecode dd(p, dc);
    const flashlite::DecodePlan plan = fltest::suite_plan_decode(dd.args, -1, cfg.splits);
    EXPECT_GT(plan.num_splits, 1);
    DevBuf ws(nullptr, 0);
    ck(cudaMalloc(&ws.p, std::max<size_t>(plan.workspace_bytes, 16)), "workspace");
    ck(cudaMemset(ws.p, 0xff, std::max<size_t>(plan.workspace_bytes, 16)), "workspace garbage");
    dd.args.plan = &plan;
    auto poison = [&] {
      dd.out.up(poisoned_out.data());
      dd.lse.up(poisoned_lse.data());
    };
    auto check = [&](const char* what) {
      SCOPED_TRACE(what);
      dd.download();
      expect_decode_matches(p, poisoned_out);
      p.outbuf.bytes = poisoned_out;
      p.lsebuf.bytes = poisoned_lse;
    };
    for (int call = 0; call < 3; ++call) {  // eager
      dd.args.workspace = call == 1 ? nullptr : ws.p;  // call 1: decode allocates its workspace
      dd.args.workspace_bytes = call == 1 ? 0 : plan.workspace_bytes;
      poison();
      fltest::suite_decode(dd.args);
      check(call == 0 ? "eager call 0" : call == 1 ? "eager call 1 (own workspace)" : "eager call 2");
    }
    dd.args.workspace = ws.p;
    dd.args.workspace_bytes = plan.workspace_bytes;
    cudaStream_t stream;
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    dd.args.stream = stream;
    cudaGraph_t graph;
    ck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    fltest::suite_decode(dd.args);
    fltest::suite_decode(dd.args);
    ck(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec;
    ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int replay = 0; replay < 3; ++replay) {
      poison();
      ck(cudaGraphLaunch(exec, stream), "replay");
      ck(cudaStreamSynchronize(stream), "replay");
      check(("graph replay " + std::to_string(replay)).c_str());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    dd.args.stream = nullptr;
  }
}

// ------------------------------------------------------------------------------------------------ cluster merge

// On sm_90 the splits of a (sequence, kv head) merge inside a cluster when they fit one (<= 16) and the grid is at
// most one block per SM; otherwise (and before sm_90, or in the --combine re-run) the combine kernel merges
// them. Batch 1, 8 kv heads: 2..16 splits take the cluster, 17 and 32 the combine kernel; each against float64, for
// bf16 / D 128 / contiguous / q_len 1 and f16 / D 64 / pages of 16 / q_len 8 (causal) with sink logits. The first
// also reads its K/V with the L2 evict-first policy (at least half the L2), the second with the normal one.
TEST(GpuKv, SplitsMergeInAClusterOrTheCombineKernel) {
  SKIP_WITHOUT_GPU();
  const bool clusters = cluster_merge_on();
  const int sms = sm_count();
  for (const bool second : {false, true}) {
    SCOPED_TRACE(second ? "f16 d64 paged16 q8" : "bf16 d128 contiguous q1");
    CacheSpec cs;
    cs.lens = {second ? 3000 : 8192};
    cs.kv_heads = 8;
    cs.head_dim = second ? 64 : 128;
    cs.dtype = second ? DType::f16 : DType::bf16;
    cs.paged = second;
    DecodeSpec ds;
    ds.q_heads = 32;
    ds.q_len = second ? 8 : 1;
    ds.opt.causal = second;
    ds.sink_logits = true;
    HostCache cache(cs, second ? 43 : 41);
    DecodeProblem p(cache, ds, second ? 44 : 42);
    const std::vector<uint8_t> out_before = p.outbuf.bytes, lse_before = p.lsebuf.bytes;
    DeviceCache dc(cache);
    for (int s : {0, 2, 5, 8, 16, 17, 32}) {
      SCOPED_TRACE("splits " + std::to_string(s));
      p.outbuf.bytes = out_before;  // the poisoned output and LSE again (the device copies are made from these)
      p.lsebuf.bytes = lse_before;
      DeviceDecode dd(p, dc);
      const flashlite::DecodePlan plan = fltest::suite_plan_decode(dd.args, -1, s);
      dd.args.plan = &plan;
      const std::string name = fltest::suite_decode_kernel_name(dd.args);
      std::printf("  %s\n", name.c_str());
      const bool in_cluster = name.find("cluster merge") != std::string::npos;
      const bool expect = clusters && plan.num_splits > 1 && plan.num_splits <= 16 && 8 * plan.num_splits <= sms;
      EXPECT_EQ(in_cluster, expect) << name;
      EXPECT_EQ(name.find("combine kernel") != std::string::npos, plan.num_splits > 1 && !expect) << name;
      // The first case reads 8192 x 8 x 128 x 4 B = 32 MiB (evict-first on an H100's 50 MB L2), the second 6 MB.
      const int64_t kv_bytes = int64_t(cs.lens[0]) * cs.kv_heads * cs.head_dim * 2 * 2;
      EXPECT_EQ(name.find("K/V evict-first") != std::string::npos, expect_kv_evict_first(kv_bytes)) << name;
      fltest::suite_decode(dd.args);
      dd.download();
      expect_decode_matches(p, out_before);
    }
  }
}

// The decode planner's merge overrides on the device: the combine kernel at any split count, the cluster merge where it
// can run (sm_90, splits that fit one cluster: at most 16), else an unsupported plan that names why, and decode() under
// it throws that. Every run against float64 (bf16, D 128, batch 1, 8 kv heads, GQA 4).
TEST(GpuKv, PlannerMergeOverrides) {
  SKIP_WITHOUT_GPU();
  int major = 0;
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "compute capability");
  CacheSpec cs;
  cs.lens = {3000};
  cs.kv_heads = 8;
  cs.head_dim = 128;
  cs.dtype = DType::bf16;
  DecodeSpec ds;
  ds.q_heads = 32;
  HostCache cache(cs, 51);
  DecodeProblem p(cache, ds, 52);
  const std::vector<uint8_t> out_before = p.outbuf.bytes, lse_before = p.lsebuf.bytes;
  DeviceCache dc(cache);
  for (const flashlite::DecodeMerge merge : {flashlite::DecodeMerge::combine, flashlite::DecodeMerge::cluster})
    for (const int splits : {4, 32}) {
      const bool cluster = merge == flashlite::DecodeMerge::cluster;
      SCOPED_TRACE(std::string(cluster ? "cluster" : "combine") + ", splits " + std::to_string(splits));
      p.outbuf.bytes = out_before;
      p.lsebuf.bytes = lse_before;
      DeviceDecode dd(p, dc);
      const flashlite::DecodePlan plan = flashlite::plan_decode(dd.args, -1, {splits, merge});
      dd.args.plan = &plan;
      if (cluster && (major < 9 || splits > 16)) {
        EXPECT_FALSE(plan.supported());
        EXPECT_NE(plan.unsupported.find("the cluster merge needs"), std::string::npos) << plan.unsupported;
        EXPECT_THROW(flashlite::decode(dd.args), flashlite::Error);
        continue;
      }
      ASSERT_TRUE(plan.supported()) << plan.unsupported;
      EXPECT_EQ(plan.num_splits, splits);
      EXPECT_EQ(plan.cluster_merge, cluster);
      const std::string name = flashlite::decode_kernel_name(dd.args);
      EXPECT_NE(name.find(cluster ? "cluster merge" : "combine kernel"), std::string::npos) << name;
      flashlite::decode(dd.args);
      dd.download();
      expect_decode_matches(p, out_before);
    }
}

// The decode kernels' attributes (shared-memory opt-in, carveout) belong to the CUDA context: after cudaDeviceReset
// they are set again. A cluster-merge case and a combine-kernel case (bf16 D 128, fp16 D 64), before and after.
TEST(GpuKv, DecodeRunsAgainAfterCudaDeviceReset) {
  SKIP_WITHOUT_GPU();
  std::vector<GpuCase> cases;
  for (const GpuCase& c : gpu_cases()) {
    if (c.name == "contig_bfloat16_d128_hq16_hkv4_q1_cluster" || c.name == "contig_float16_d64_hq32_hkv4_q2_padded" ||
        c.name == "splits17") {
      cases.push_back(c);
    }
  }
  ASSERT_EQ(cases.size(), 3u) << "the case names went stale";
  for (int round = 0; round < 2; ++round) {
    for (const GpuCase& c : cases) {
      SCOPED_TRACE(std::string(round ? "after the reset: " : "before the reset: ") + c.name);
      run_grid_case(c);
    }
    if (round == 0) ck(cudaDeviceReset(), "cudaDeviceReset");
  }
}

// ------------------------------------------------------------------------------------------------ CUDA-only errors

TEST(GpuKv, CudaSpecificErrors) {
  SKIP_WITHOUT_GPU();
  CacheSpec cs;
  cs.lens = {10, 20};
  cs.dtype = DType::f32;  // no CUDA decode kernel for float32
  HostCache cache(cs, 5);
  DecodeProblem p(cache, DecodeSpec{}, 6);
  DeviceCache dc(cache);
  DeviceDecode dd(p, dc);
  try {
    fltest::suite_decode(dd.args);
    ADD_FAILURE() << "float32 decode on CUDA should be rejected";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("float16 or bfloat16"), std::string::npos) << e.what();
  }
  // A missing device index.
  cs.dtype = DType::bf16;
  HostCache c2(cs, 7);
  DecodeProblem p2(c2, DecodeSpec{}, 8);
  DeviceCache dc2(c2);
  DeviceDecode dd2(p2, dc2);
  dd2.args.cache.device.seq_lens = TensorView{};
  EXPECT_THROW(fltest::suite_decode(dd2.args), flashlite::Error);
  // A workspace smaller than the plan's.
  dd2.args.cache = dc2.view;
  const flashlite::DecodePlan plan = fltest::suite_plan_decode(dd2.args, -1, 4);
  dd2.args.plan = &plan;
  dd2.args.workspace = dc2.k.p;
  dd2.args.workspace_bytes = plan.workspace_bytes - 1;
  try {
    fltest::suite_decode(dd2.args);
    ADD_FAILURE() << "a short workspace should be rejected";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtest
