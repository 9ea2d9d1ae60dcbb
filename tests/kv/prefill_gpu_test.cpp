// prefill() on CUDA against float64 (skipped without a GPU): the fused kernel's KV-cache variant over contiguous and
// paged caches (shuffled non-contiguous page tables, page sizes 16..256 incl. 48 and 100, tiles spanning pages),
// ragged chunks incl. 1 and empty, long sequences (past the fold length too), windows crossing pages, sinks, softcap, sink logits, GQA / MQA,
// bf16 / fp16, head_dim 64 / 128; ragged batches past the inline offset table; prefill equal to forward() over the
// same K/V as plain tensors; chunked equal to one-shot; unsupported cases rejected before any launch. Set
// FLASHLITE_PREFILL_BENCH=1 (or =file.json) to also time paged vs contiguous prefill vs forward() (PrefillGpuBench;
// prints JSON, FLASHLITE_COMMIT names the commit in it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>

#include "kv_gpu_util.h"
#include "prefill_test_util.h"

namespace kvtest {
namespace {


// Runs prefill on the GPU for host-side args: every view (cache K/V, index arrays, q, out, lse, sink logits) is copied
// to the device with its bytes, the call runs with backend cuda, and out / lse come back into the host buffers.
class GpuRunner {
 public:
  explicit GpuRunner(HostCache& c) : k_(c.kbuf.bytes.data(), c.kbuf.bytes.size()), v_(c.vbuf.bytes.data(), c.vbuf.bytes.size()) {}

  void operator()(PrefillArgs a) {
    const TensorView out_host = a.out, lse_host = a.lse;
    to_device(a);
    flashlite::prefill(a);
    ck(cudaDeviceSynchronize(), "prefill kernel");
    down(out_host, a.out);
    down(lse_host, a.lse);
  }
  std::string kernel_name(PrefillArgs a) {
    to_device(a);
    return flashlite::prefill_kernel_name(a);
  }

 private:
  static size_t span(const TensorView& t) {  // bytes from data to one past the last element (strides >= 0)
    if (t.numel() == 0) return 0;
    int64_t hi = 0;
    for (int i = 0; i < t.rank; ++i) hi += (t.shape[i] - 1) * t.strides[i];
    return size_t(hi + 1) * flashlite::dtype_size(t.dtype);
  }
  void to_device(PrefillArgs& a) {
    bufs_.clear();
    a.cache.k.data = k_.p, a.cache.k.device = Device::cuda(0);
    a.cache.v.data = v_.p, a.cache.v.device = Device::cuda(0);
    a.cache.device.seq_lens = up(a.cache.host.seq_lens);
    a.cache.device.page_indptr = up(a.cache.host.page_indptr);
    a.cache.device.page_indices = up(a.cache.host.page_indices);
    a.cache.device.last_page_len = up(a.cache.host.last_page_len);
    a.q = up(a.q);
    a.out = up(a.out);
    a.lse = up(a.lse);
    a.options.sink_logits = up(a.options.sink_logits);
    a.backend = Backend::cuda;
  }
  TensorView up(TensorView t) {
    if (t.data == nullptr) return t;
    bufs_.push_back(std::make_unique<DevBuf>(t.data, span(t)));
    t.data = bufs_.back()->p;
    t.device = Device::cuda(0);
    return t;
  }
  static void down(const TensorView& host, const TensorView& dev) {
    if (host.data) ck(cudaMemcpy(host.data, dev.data, span(host), cudaMemcpyDeviceToHost), "D2H");
  }
  DevBuf k_, v_;
  std::vector<std::unique_ptr<DevBuf>> bufs_;
};

void run_and_check(const PrefillCase& t, const Tol& tol = {}) {
  HostCache cache(cache_of(t), fltest::seed_of(t.name));
  PrefillProblem p(cache, spec_of(t), fltest::seed_of(t.name + "q"));
  const auto out_before = p.outbuf.bytes, lse_before = p.lsebuf.bytes;
  GpuRunner gpu(cache);
  EXPECT_EQ(gpu.kernel_name(p.args).rfind(t.paged ? "cuda_prefill_paged_" : "cuda_prefill_contiguous_", 0), 0u);
  gpu(p.args);
  expect_prefill_matches(p, out_before, lse_before, tol);
}

class PrefillGpuGrid : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PrefillGpuGrid, MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  run_and_check(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillGpuGrid, ::testing::ValuesIn(prefill_grid(false)),
                         [](const auto& info) { return info.param.name; });

// Runs run_and_check over page sizes (0: a contiguous cache) and head_dim 64 / 128, the rest of each case from `fill`.
template <class Fill>
void for_page_sizes_and_dims(const std::string& prefix, std::initializer_list<int64_t> page_sizes, Fill fill) {
  for (int64_t ps : page_sizes) {
    for (int64_t d : {64, 128}) {
      PrefillCase t;
      t.name = prefix + "_ps" + std::to_string(ps) + "_d" + std::to_string(d);
      SCOPED_TRACE(t.name);
      t.paged = ps > 0;
      t.page_size = ps > 0 ? ps : 16;
      t.head_dim = d;
      fill(t);
      run_and_check(t);
    }
  }
}

// Long ragged sequences at every page size the cache accepts a sample of (tiles of 64 keys span up to 4 pages of 16,
// pages of 48 / 100 straddle tiles), a window of 700 crossing pages, sinks.
TEST(PrefillGpu, LongSequencesAllPageSizes) {
  SKIP_WITHOUT_GPU();
  for_page_sizes_and_dims("long", {0, 16, 48, 100, 256}, [](PrefillCase& t) {
    t.q_heads = 8, t.kv_heads = 2;
    t.lens = {4097, 1, 1000, 12000, 130};
    t.chunks = {300, 1, 1000, 64, 129};
    t.opt = window_opt(700, 4);
  });
}

// Sequences longer than cuda_fwd::kFoldKeys (32768): their rows fold O out of the MMA accumulators between key
// segments (fwd_params.h), in the cache variant too; a short sequence beside them does not fold.
TEST(PrefillGpu, RowsPastTheFoldLength) {
  SKIP_WITHOUT_GPU();
  for_page_sizes_and_dims("fold", {0, 16}, [](PrefillCase& t) {
    t.q_heads = 4, t.kv_heads = 2;
    t.lens = {70001, 5, 40000};
    t.chunks = {64, 5, 3};
    t.sink_logits = true;
  });
}

// More sequences than the offsets inline in the kernel parameters (128): the offsets travel in a device table.
TEST(PrefillGpu, RaggedBatchPastInlineTable) {
  SKIP_WITHOUT_GPU();
  PrefillCase t;
  t.name = "ragged150";
  t.page_size = 16;
  std::mt19937 rng(3);
  for (int b = 0; b < 150; ++b) {
    const int32_t len = 1 + int32_t(rng() % 300);
    t.lens.push_back(len);
    t.chunks.push_back(b % 7 == 0 ? 0 : 1 + int32_t(rng() % uint32_t(len)));
  }
  t.opt = causal_opt();
  t.q_heads = 4, t.kv_heads = 2;
  run_and_check(t);
}

// Prefill over a cache holding the same K/V as plain [batch, L, kv_heads, D] tensors: the same kernel arithmetic as
// forward() on those tensors (same causal tile), so the outputs agree to the last bit or nearly.
TEST(PrefillGpu, EqualsForwardOnContiguousTensors) {
  SKIP_WITHOUT_GPU();
  for (int64_t d : {64, 128}) {
    for (bool paged : {false, true}) {
      PrefillCase t;
      t.name = std::string("vs_forward_") + (paged ? "paged" : "contig") + std::to_string(d);
      SCOPED_TRACE(t.name);
      t.paged = paged;
      t.page_size = 16;
      t.head_dim = d;
      t.q_heads = 8, t.kv_heads = 2;
      t.lens = {777, 777};
      t.q_len = 777;
      t.opt = causal_opt();
      HostCache cache(cache_of(t), 41);
      PrefillProblem p(cache, spec_of(t), 42);
      GpuRunner gpu(cache);
      gpu(p.args);
      // The same K/V gathered into plain tensors, forward() on the GPU.
      const int64_t B = 2, L = 777, H = 2, Hq = 8;
      const size_t es = 2;
      Buffer k(t.dtype, B * L * H * d), v(t.dtype, B * L * H * d), out(t.dtype, B * L * Hq * d);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < L; ++j)
          for (int64_t h = 0; h < H; ++h) {
            std::memcpy(k.at(((b * L + j) * H + h) * d), cache.kbuf.bytes.data() + cache.offset(b, j, h) * int64_t(es), size_t(d) * es);
            std::memcpy(v.at(((b * L + j) * H + h) * d), cache.vbuf.bytes.data() + cache.offset(b, j, h) * int64_t(es), size_t(d) * es);
          }
      DevBuf dq(p.qbuf.bytes.data(), p.qbuf.bytes.size()), dk(k.bytes.data(), k.bytes.size()), dv(v.bytes.data(), v.bytes.size()),
          dout(nullptr, out.bytes.size());
      const auto view = [&](void* ptr, int64_t heads) {
        TensorView x = fltest::view_n(ptr, t.dtype, {B, L, heads, d}, {L * heads * d, heads * d, d, 1});
        x.device = Device::cuda(0);
        return x;
      };
      flashlite::ForwardArgs fa;
      fa.q = view(dq.p, Hq);
      fa.k = view(dk.p, H);
      fa.v = view(dv.p, H);
      fa.out = view(dout.p, Hq);
      fa.options = t.opt;
      fa.backend = Backend::cuda;
      flashlite::forward(fa);
      ck(cudaMemcpy(out.data(), dout.p, out.bytes.size(), cudaMemcpyDeviceToHost), "D2H");
      int64_t differ = 0;
      double max_abs = 0;
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double a = fltest::load(t.dtype, p.outbuf.bytes.data(), i), b = fltest::load(t.dtype, out.bytes.data(), i);
        ASSERT_TRUE(std::isfinite(a)) << "prefill output " << i;
        differ += a != b;
        max_abs = std::max(max_abs, std::fabs(a - b));
      }
      std::printf("%s: %lld of %lld outputs differ from forward() (max abs %.3g)\n", t.name.c_str(), (long long)differ,
                  (long long)out.numel(), max_abs);
      EXPECT_LE(max_abs, 1e-2) << "prefill vs forward() on the same K/V";
    }
  }
}

TEST(PrefillGpu, ChunkedEqualsOneShot) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false}) {
    for (int64_t d : {64, 128}) {
      check_chunked_equals_oneshot(paged, DType::bf16, d, {700, 37, 300}, 200,
                                   [](HostCache& c, PrefillArgs a) {
                                     GpuRunner gpu(c);
                                     gpu(a);
                                   });
    }
  }
}

// Cases the CUDA kernel does not serve are rejected by name before anything is launched (out stays NaN).
TEST(PrefillGpu, UnsupportedRejectedBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  for (auto [d, t, part] : {std::tuple{96, DType::bf16, "head_dim 96"}, std::tuple{64, DType::f32, "float32 caches"}}) {
    PrefillCase c;
    c.name = "unsupported";
    c.head_dim = d;
    c.dtype = t;
    c.lens = {40, 17};
    c.chunks = {5, 17};
    c.opt = causal_opt();
    HostCache cache(cache_of(c), 5);
    PrefillProblem p(cache, spec_of(c), 6);
    const auto before = p.outbuf.bytes;
    try {
      GpuRunner gpu(cache);
      gpu(p.args);
      ADD_FAILURE() << "expected an error naming " << part;
    } catch (const flashlite::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_TRUE(p.outbuf.bytes == before);
  }
}

// ------------------------------------------------------------------------------------------------ timing (opt-in)

// Median of `reps` CUDA-event timings of f (after 3 warm-ups), milliseconds.
template <class F>
double time_ms(F&& f, int reps = 20) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float x = 0;
    cudaEventElapsedTime(&x, a, b);
    ms.push_back(x);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Llama-3-8B attention shape (Hq 32, Hkv 8, D 128, bf16, causal): prefill of a chunk of n tokens at the end of
// sequences of L tokens, from a contiguous cache and paged caches (pages shuffled over the pool), and forward() on
// plain contiguous tensors of the same K/V. FLOPs = 4 * D * Hq * (visible query-key pairs).
TEST(PrefillGpuBench, PagedVsContiguousVsForward) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("FLASHLITE_PREFILL_BENCH")) GTEST_SKIP() << "set FLASHLITE_PREFILL_BENCH=1";
  const int64_t Hq = 32, H = 8, D = 128;
  const DType t = DType::bf16;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::string json = std::string("{\"device\": \"") + prop.name + "\", \"commit\": \"" +
                     (std::getenv("FLASHLITE_COMMIT") ? std::getenv("FLASHLITE_COMMIT") : "unknown") +
                     "\", \"flops\": \"4 * D * Hq * visible query-key pairs\", \"timing\": \"CUDA events, median of 20 after 3 warm-ups\", \"rows\": [\n";
  char buf[512];
  bool first = true;
  for (auto [B, L, n] : {std::tuple<int64_t, int64_t, int64_t>{4, 4096, 4096}, {1, 16384, 16384}, {4, 8192, 1024}, {16, 2048, 512}}) {
    const double pairs = double(B) * (double(n) * double(L - n) + double(n) * double(n + 1) / 2);
    const double flops = 4.0 * double(D) * double(Hq) * pairs;
    std::vector<std::pair<std::string, double>> cols;
    // q / out on the device, random.
    Buffer qh(t, B * n * Hq * D);
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t i = 0; i < qh.numel(); ++i) fltest::store(t, qh.data(), i, normal(rng));
    DevBuf q(qh.bytes.data(), qh.bytes.size()), out(nullptr, qh.bytes.size());
    const auto dview = [&](void* p, int64_t rows, int64_t heads) {
      TensorView x = fltest::view_n(p, t, {B, rows, heads, D}, {rows * heads * D, heads * D, D, 1});
      x.device = Device::cuda(0);
      return x;
    };
    AttentionOptions opt = causal_opt();
    // forward() on plain tensors: k / v [B, L, H, D] (the contiguous cache's storage, max_len = L).
    const size_t kv_bytes = size_t(B * L * H * D) * 2;
    DevBuf k(nullptr, kv_bytes), v(nullptr, kv_bytes);
    {
      std::vector<uint8_t> r(kv_bytes);
      for (size_t i = 0; i < kv_bytes / 2; ++i) fltest::store(t, r.data(), int64_t(i), normal(rng));
      ck(cudaMemcpy(k.p, r.data(), kv_bytes, cudaMemcpyHostToDevice), "H2D");
      ck(cudaMemcpy(v.p, r.data(), kv_bytes, cudaMemcpyHostToDevice), "H2D");
    }
    flashlite::ForwardArgs fa;
    fa.q = dview(q.p, n, Hq);
    fa.k = dview(k.p, L, H);
    fa.v = dview(v.p, L, H);
    fa.out = dview(out.p, n, Hq);
    fa.options = opt;
    fa.backend = Backend::cuda;
    cols.push_back({"forward", time_ms([&] { flashlite::forward(fa); })});
    // Contiguous cache over the same storage.
    std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(L));
    DevBuf dlens(lens.data(), lens.size() * 4);
    PrefillArgs pa;
    pa.q = fa.q;
    pa.out = fa.out;
    pa.options = opt;
    pa.cache.layout = flashlite::KvLayout::contiguous;
    pa.cache.k = fa.k;
    pa.cache.v = fa.v;
    pa.cache.host.seq_lens = i32_view(lens);
    pa.cache.device.seq_lens = i32_view(lens);
    pa.cache.device.seq_lens.data = dlens.p, pa.cache.device.seq_lens.device = Device::cuda(0);
    pa.backend = Backend::cuda;
    cols.push_back({"prefill_contiguous", time_ms([&] { flashlite::prefill(pa); })});
    // Paged caches: the same storage viewed as pages, the page table a random permutation.
    for (int64_t ps : {16, 64, 256}) {
      const int64_t pages_per_seq = L / ps, num_pages = B * pages_per_seq;
      std::vector<int32_t> indptr, indices(static_cast<size_t>(num_pages)), last(static_cast<size_t>(B), static_cast<int32_t>(ps));
      for (int64_t b = 0; b <= B; ++b) indptr.push_back(int32_t(b * pages_per_seq));
      std::iota(indices.begin(), indices.end(), 0);
      std::shuffle(indices.begin(), indices.end(), rng);
      DevBuf di(indptr.data(), indptr.size() * 4), dx(indices.data(), indices.size() * 4), dl(last.data(), last.size() * 4);
      PrefillArgs pp = pa;
      pp.cache = {};
      pp.cache.layout = flashlite::KvLayout::paged;
      pp.cache.k = fltest::view_n(k.p, t, {num_pages, ps, H, D}, {ps * H * D, H * D, D, 1});
      pp.cache.v = fltest::view_n(v.p, t, {num_pages, ps, H, D}, {ps * H * D, H * D, D, 1});
      pp.cache.k.device = pp.cache.v.device = Device::cuda(0);
      pp.cache.host.page_indptr = i32_view(indptr);
      pp.cache.host.page_indices = i32_view(indices);
      pp.cache.host.last_page_len = i32_view(last);
      pp.cache.device = pp.cache.host;
      pp.cache.device.page_indptr.data = di.p, pp.cache.device.page_indices.data = dx.p, pp.cache.device.last_page_len.data = dl.p;
      for (TensorView* x : {&pp.cache.device.page_indptr, &pp.cache.device.page_indices, &pp.cache.device.last_page_len}) {
        x->device = Device::cuda(0);
      }
      cols.push_back({"prefill_paged" + std::to_string(ps), time_ms([&] { flashlite::prefill(pp); })});
    }
    ck(cudaGetLastError(), "bench");
    std::snprintf(buf, sizeof buf, "%s  {\"batch\": %lld, \"kv_len\": %lld, \"chunk\": %lld, \"hq\": %lld, \"hkv\": %lld, \"d\": %lld, \"causal\": true",
                  first ? "" : ",\n", (long long)B, (long long)L, (long long)n, (long long)Hq, (long long)H, (long long)D);
    json += buf;
    for (auto& [name, ms] : cols) {
      std::snprintf(buf, sizeof buf, ", \"%s_us\": %.1f, \"%s_tflops\": %.1f", name.c_str(), ms * 1e3, name.c_str(), flops / (ms * 1e-3) / 1e12);
      json += buf;
    }
    json += "}";
    first = false;
  }
  json += "\n]}\n";
  std::fputs(json.c_str(), stdout);
  if (const char* path = std::getenv("FLASHLITE_PREFILL_BENCH"); std::string(path) != "1") {  // a file to write
    if (FILE* f = std::fopen(path, "w")) std::fputs(json.c_str(), f), std::fclose(f);
  }
}

}  // namespace
}  // namespace kvtest
