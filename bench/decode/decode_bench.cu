// Decode benchmark (GPU machine): flashlite::decode over contiguous and paged bf16 caches, timed with CUDA events,
// against the device's measured read bandwidth (a large read-only reduction in the same process).
//
//   flashlite_decode_bench --out decode_raw.json [--reps 30] [--sweep] [--quick] [--only B:L:PAGE[:Q],...] [--no-bw]
//                          [--max-copies N] [--timeline]
//
// --only runs just those cases (page 0 = contiguous; no recompute rows), e.g. under ncu; --no-bw skips the bandwidth
// measurement (its percentages are then of 3.0 TB/s).
//
// Protocol (DESIGN.md): inputs rotated so the L2 does not hold them: the case's cache is allocated in enough copies
// to span >= 200 MB (4x the L2) and consecutive timed calls cycle through them; each call timed with CUDA events,
// median of --reps after 3 warm-up calls. A second, "cold" figure precedes every call with an untimed read of a
// 512 MB buffer (L2 and TLBs cold: what a step costs after other large kernels). Bytes counted: the K and V rows the call must read
// (sum of lengths x kv_heads x head_dim x 2 bytes x 2). Each case is checked first: sequence 0, kv head 0's GQA group
// against the float64 computation on the host from the downloaded cache.
// Both figures are event-timed eager calls: they include the host time of decode() (validation, planning, the
// launches) whenever the GPU is idle when the call starts, which it is in the main column; in the cold column the
// flush kernel is still running while the host prepares the call, so at small sizes "cold" reads faster.
// Two more figures per case: host_us, the host time of one decode() call (median, no synchronisation), and us_graph,
// the per-call time of a CUDA graph of N back-to-back decode calls on the rotated inputs (median replay / N): what a
// step costs inside the engine's captured decode graph, without host time.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashlite/kv_cache.h"
#if FLASHLITE_DECODE_TIMELINE
#include "cuda/decode/decode_params.h"
#include "kv/kv_backends.h"
#endif

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

#if FLASHLITE_DECODE_TIMELINE
// --timeline (diagnostic builds): the split blocks' stamps of a graph's last two calls (launch.cu alternates slots).
constexpr size_t kTimelineSlotBlocks = 8192;
unsigned long long* g_timeline = nullptr;

// Per stamp of the last call: median and max over its blocks, in us after the previous call's last block ended.
void print_timeline(const char* label, int blocks, int calls) {
  using flashlite::cuda_decode::kTimelineStamps;
  std::vector<unsigned long long> h(2 * kTimelineSlotBlocks * kTimelineStamps);
  ck(cudaMemcpy(h.data(), g_timeline, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "timeline");
  const unsigned long long* last = h.data() + size_t((calls - 1) % 2) * kTimelineSlotBlocks * kTimelineStamps;
  const unsigned long long* prev = h.data() + size_t((calls - 2) % 2) * kTimelineSlotBlocks * kTimelineStamps;
  unsigned long long prev_end = 0;
  for (int b = 0; b < blocks; ++b) prev_end = std::max(prev_end, prev[size_t(b) * kTimelineStamps + 6]);
  std::printf("timeline %s (us after the previous call's last split block; median / max over %d blocks):", label, blocks);
  const char* names[] = {"entry", "wait", "len", "q", "tile0", "loop", "merged", "end", "cluster_barrier", "cluster_merged"};
  for (int k : {0, 1, 7, 2, 3, 4, 5, 9, 10, 6}) {
    std::vector<double> v;
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long t = last[size_t(b) * kTimelineStamps + k];
      if (t) v.push_back((double(t) - double(prev_end)) * 1e-3);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("  %s %.2f/%.2f", names[k == 7 ? 2 : k < 2 ? k : k >= 9 ? k - 1 : k + 1], v[v.size() / 2], v.back());
  }
  std::vector<unsigned long long> sms;
  for (int b = 0; b < blocks; ++b)
    if (last[size_t(b) * kTimelineStamps + 8]) sms.push_back(last[size_t(b) * kTimelineStamps + 8]);
  std::sort(sms.begin(), sms.end());
  std::printf("  on %zu SMs\n", size_t(std::unique(sms.begin(), sms.end()) - sms.begin()));
}
#endif

// ---------------------------------------------------------------- device helpers

// Read-only reduction: every 16-byte word read once (grid-stride, U independent loads in flight per thread), one
// value written per block only if a magic value appears (keeps the loads).
template <int U>
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// Deterministic pseudo-random bf16 in [-2, 2).
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    p[i] = __float2bfloat16(float(x & 0xffff) / 16384.f - 2.f);
  }
}

struct Flusher {
  void* buf = nullptr;
  size_t bytes = size_t(512) << 20;
  unsigned* sink = nullptr;
  int sms = 0;
  Flusher() {
    ck(cudaMalloc(&buf, bytes), "flush buffer");
    ck(cudaMemset(buf, 1, bytes), "memset");
    ck(cudaMalloc(&sink, 1 << 16), "sink");
    ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sms");
  }
  void run() { read_kernel<4><<<sms * 4, 512>>>(static_cast<const uint4*>(buf), bytes / 16, sink); }
};

// Measured read bandwidth: the best over a few launch shapes of the median of 10 reductions over 4 GiB.
double measure_read_bw(int sms, unsigned* sink) {
  const size_t bytes = size_t(4) << 30;
  void* buf;
  ck(cudaMalloc(&buf, bytes), "bw buffer");
  ck(cudaMemset(buf, 3, bytes), "memset");
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  double best = 0;
  for (int shape = 0; shape < 4; ++shape) {
    std::vector<float> ms;
    for (int r = 0; r < 13; ++r) {
      cudaEventRecord(a);
      const auto* src = static_cast<const uint4*>(buf);
      if (shape == 0) read_kernel<1><<<sms * 8, 512>>>(src, bytes / 16, sink);
      if (shape == 1) read_kernel<4><<<sms * 4, 512>>>(src, bytes / 16, sink);
      if (shape == 2) read_kernel<8><<<sms * 2, 512>>>(src, bytes / 16, sink);
      if (shape == 3) read_kernel<4><<<sms * 2, 1024>>>(src, bytes / 16, sink);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t;
      cudaEventElapsedTime(&t, a, b);
      if (r >= 3) ms.push_back(t);
    }
    ck(cudaGetLastError(), "read kernel");
    std::sort(ms.begin(), ms.end());
    const double tbps = double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e12;
    std::printf("read bandwidth, launch shape %d: %.3f TB/s\n", shape, tbps);
    best = std::max(best, tbps);
  }
  cudaFree(buf);
  return best;
}

// ---------------------------------------------------------------- one decode case

struct Case {
  int batch, kv_len, page;  // page 0 = contiguous
  int hq = 32, hkv = 8, d = 128, q_len = 1;
};

int g_max_copies = 0;  // --max-copies N (0: the protocol's rotation)

struct Result {
  double us_median = 0, us_min = 0, us_max = 0;  // rotated inputs
  double us_cold = 0;                            // after an L2 / TLB flush
  double us_graph = -1;                          // per call, CUDA graph of graph_calls back-to-back calls
  int graph_calls = 0;
  double host_us = 0;                            // host time of one decode() call
  int copies = 1;
  int splits = 0;
  double rel_err = 0;
  std::string kernel;
};

template <class T>
T* dalloc(size_t n) {
  T* p;
  ck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return p;
}

float bf(const __nv_bfloat16& x) { return __bfloat162float(x); }

Result run_case(const Case& c, Flusher& fl, int reps, int forced_splits, bool check, bool extras = true) {
  using namespace flashlite;
  const int64_t B = c.batch, L = c.kv_len, H = c.hkv, D = c.d, Hq = c.hq;
  const bool paged = c.page > 0;
  const int64_t P = paged ? c.page : L;
  const int64_t pages_per_seq = (L + P - 1) / P;
  const int64_t pool = paged ? B * pages_per_seq : B;  // pages (or sequences) in the pool
  const int64_t slots = paged ? P : L;
  const size_t kv_elems = size_t(pool * slots * H * D);
  int copies = int(std::min<size_t>(64, std::max<size_t>(1, ((size_t(200) << 20) + 4 * kv_elems - 1) / (4 * kv_elems))));
  if (g_max_copies > 0) copies = std::min(copies, g_max_copies);  // --max-copies: diagnostics (L2 / TLB reach)
  std::vector<__nv_bfloat16*> ks, vs;
  for (int cp = 0; cp < copies; ++cp) {
    ks.push_back(dalloc<__nv_bfloat16>(kv_elems));
    vs.push_back(dalloc<__nv_bfloat16>(kv_elems));
    fill_kernel<<<1024, 256>>>(ks.back(), kv_elems, 1 + 2 * cp);
    fill_kernel<<<1024, 256>>>(vs.back(), kv_elems, 2 + 2 * cp);
  }
  __nv_bfloat16* k = ks[0];
  __nv_bfloat16* v = vs[0];
  auto* q = dalloc<__nv_bfloat16>(size_t(B * c.q_len * Hq * D));
  auto* out = dalloc<__nv_bfloat16>(size_t(B * c.q_len * Hq * D));
  fill_kernel<<<64, 256>>>(q, size_t(B * c.q_len * Hq * D), 3);

  // Index: contiguous lengths, or a shuffled page table (pages of a sequence scattered over the pool).
  std::vector<int32_t> lens(static_cast<size_t>(B), int32_t(L)), indptr{0}, indices, last;
  if (paged) {
    std::vector<int32_t> perm(static_cast<size_t>(pool));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    indices = perm;
    for (int64_t b = 0; b < B; ++b) {
      indptr.push_back(int32_t((b + 1) * pages_per_seq));
      last.push_back(int32_t(L - (pages_per_seq - 1) * P));
    }
  }
  auto up = [](std::vector<int32_t>& h) {
    int32_t* d = dalloc<int32_t>(h.size());
    ck(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "index H2D");
    return d;
  };
  auto i32 = [](void* p, int64_t n) { return TensorView::contiguous(p, DType::i32, Device::cpu(), {n}); };
  auto dev = [](TensorView t) {
    t.device = Device::cuda(0);
    return t;
  };
  DecodeArgs a;
  a.cache.layout = paged ? KvLayout::paged : KvLayout::contiguous;
  a.cache.k = TensorView::contiguous(k, DType::bf16, Device::cuda(0), {pool, slots, H, D});
  a.cache.v = TensorView::contiguous(v, DType::bf16, Device::cuda(0), {pool, slots, H, D});
  std::vector<int32_t*> dev_idx;
  if (!paged) {
    a.cache.host.seq_lens = i32(lens.data(), B);
    dev_idx.push_back(up(lens));
    a.cache.device.seq_lens = dev(i32(dev_idx[0], B));
  } else {
    a.cache.host.page_indptr = i32(indptr.data(), B + 1);
    a.cache.host.page_indices = i32(indices.data(), int64_t(indices.size()));
    a.cache.host.last_page_len = i32(last.data(), B);
    dev_idx = {up(indptr), up(indices), up(last)};
    a.cache.device.page_indptr = dev(i32(dev_idx[0], B + 1));
    a.cache.device.page_indices = dev(i32(dev_idx[1], int64_t(indices.size())));
    a.cache.device.last_page_len = dev(i32(dev_idx[2], B));
  }
  a.q = TensorView::contiguous(q, DType::bf16, Device::cuda(0), {B, c.q_len, Hq, D});
  a.out = TensorView::contiguous(out, DType::bf16, Device::cuda(0), {B, c.q_len, Hq, D});
  a.options.causal = true;
  const DecodePlan plan = plan_decode(a, -1, {forced_splits});
  void* ws = plan.workspace_bytes ? dalloc<char>(plan.workspace_bytes) : nullptr;
  a.plan = &plan;
  a.workspace = ws;
  a.workspace_bytes = plan.workspace_bytes;
  Result r;
  r.splits = plan.num_splits;
  r.kernel = decode_kernel_name(a);

  decode(a);
  ck(cudaDeviceSynchronize(), "decode");
  if (check) {  // sequence 0, kv head 0: its group's q heads vs float64 on the host
    const int64_t G = Hq / H;
    std::vector<__nv_bfloat16> hq(static_cast<size_t>(G * D)), ho(static_cast<size_t>(G * D)), row(static_cast<size_t>(D));
    ck(cudaMemcpy(hq.data(), q, size_t(G * D) * 2, cudaMemcpyDeviceToHost), "q");
    ck(cudaMemcpy(ho.data(), out, size_t(G * D) * 2, cudaMemcpyDeviceToHost), "out");
    std::vector<double> s(static_cast<size_t>(L)), acc(static_cast<size_t>(G * D), 0.0), mx(static_cast<size_t>(G), -1e300), sum(static_cast<size_t>(G), 0.0);
    std::vector<std::vector<__nv_bfloat16>> vrows(static_cast<size_t>(L));
    std::vector<double> sc(static_cast<size_t>(G * L));
    for (int64_t j = 0; j < L; ++j) {
      const int64_t page = paged ? indices[size_t(j / P)] : 0, slot = paged ? j % P : j;
      const size_t off = size_t(((page * slots + slot) * H + 0) * D);
      ck(cudaMemcpy(row.data(), k + off, size_t(D) * 2, cudaMemcpyDeviceToHost), "k row");
      vrows[size_t(j)].resize(size_t(D));
      ck(cudaMemcpy(vrows[size_t(j)].data(), v + off, size_t(D) * 2, cudaMemcpyDeviceToHost), "v row");
      for (int64_t g = 0; g < G; ++g) {
        double dot = 0;
        for (int64_t e = 0; e < D; ++e) dot += double(bf(hq[size_t(g * D + e)])) * bf(row[size_t(e)]);
        sc[size_t(g * L + j)] = dot / std::sqrt(double(D));
        mx[size_t(g)] = std::max(mx[size_t(g)], sc[size_t(g * L + j)]);
      }
    }
    double d2 = 0, r2 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t j = 0; j < L; ++j) {
        const double w = std::exp(sc[size_t(g * L + j)] - mx[size_t(g)]);
        sum[size_t(g)] += w;
        for (int64_t e = 0; e < D; ++e) acc[size_t(g * D + e)] += w * bf(vrows[size_t(j)][size_t(e)]);
      }
      for (int64_t e = 0; e < D; ++e) {
        const double want = acc[size_t(g * D + e)] / sum[size_t(g)], got = bf(ho[size_t(g * D + e)]);
        d2 += (got - want) * (got - want), r2 += want * want;
      }
    }
    r.rel_err = std::sqrt(d2 / r2);
  }

  std::vector<DecodeArgs> rot(size_t(copies), a);
  for (int cp = 0; cp < copies; ++cp) {
    rot[size_t(cp)].cache.k.data = ks[size_t(cp)];
    rot[size_t(cp)].cache.v.data = vs[size_t(cp)];
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  auto time_one = [&](const DecodeArgs& args) {
    cudaEventRecord(e0);
    decode(args);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    return t;
  };
  std::vector<float> ms, cold;
  for (int rep = 0; rep < reps + 3; ++rep) {
    const float t = time_one(rot[size_t(rep % copies)]);
    if (rep >= 3) ms.push_back(t);
  }
  for (int rep = 0; rep < reps / 2 + 3; ++rep) {
    fl.run();
    const float t = time_one(a);
    if (rep >= 3) cold.push_back(t);
  }
  ck(cudaGetLastError(), "timed decode");
  std::sort(ms.begin(), ms.end());
  std::sort(cold.begin(), cold.end());
  r.us_median = ms[ms.size() / 2] * 1e3;
  r.us_min = ms.front() * 1e3;
  r.us_max = ms.back() * 1e3;
  r.us_cold = cold[cold.size() / 2] * 1e3;
  r.copies = copies;

  // Host time of decode() (median; the GPU keeps running, the queue stays short).
  std::vector<double> host;
  if (!extras) reps = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    decode(rot[size_t(rep % copies)]);
    const auto t1 = std::chrono::steady_clock::now();
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (rep % 8 == 7) cudaDeviceSynchronize();
  }
  ck(cudaDeviceSynchronize(), "host-timed decode");
  std::sort(host.begin(), host.end());
  r.host_us = host.empty() ? 0 : host[host.size() / 2];

  // CUDA graph of back-to-back calls on the rotated inputs.
  {
    cudaStream_t st;
    ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    const int n = std::max(copies, 8);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
#if FLASHLITE_DECODE_TIMELINE
    if (g_timeline) {
      ck(cudaMemset(g_timeline, 0, 2 * kTimelineSlotBlocks * flashlite::cuda_decode::kTimelineStamps * 8), "timeline clear");
      flashlite::cuda_decode_set_timeline(g_timeline, kTimelineSlotBlocks);
    }
#endif
    bool ok = extras && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
      for (int i = 0; i < n; ++i) {
        DecodeArgs g = rot[size_t(i % copies)];
        g.stream = st;
        decode(g);
      }
      ok = cudaStreamEndCapture(st, &graph) == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    }
    if (ok) {
      std::vector<float> gms;
      for (int rep = 0; rep < reps / 3 + 3; ++rep) {
        cudaEventRecord(e0, st);
        cudaGraphLaunch(exec, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (rep >= 2) gms.push_back(t);
      }
      std::sort(gms.begin(), gms.end());
      r.us_graph = gms[gms.size() / 2] * 1e3 / n;
      r.graph_calls = n;
#if FLASHLITE_DECODE_TIMELINE
      if (g_timeline) {
        const std::string label = "b" + std::to_string(c.batch) + " kv" + std::to_string(c.kv_len) +
                                  (paged ? " paged" + std::to_string(c.page) : std::string(" contig")) + " graph " +
                                  std::to_string(r.us_graph).substr(0, 5) + " us/call";
        print_timeline(label.c_str(), int(std::min<int64_t>(int64_t(kTimelineSlotBlocks), int64_t(r.splits) * B * H)), n);
        flashlite::cuda_decode_set_timeline(nullptr, 0);
      }
#endif
    } else if (extras) {
      std::fprintf(stderr, "graph capture failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    }
    ck(cudaGetLastError(), "graph replay");
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  for (size_t cp = 0; cp < ks.size(); ++cp) cudaFree(ks[cp]), cudaFree(vs[cp]);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(out), ws}) cudaFree(p);
  for (int32_t* p : dev_idx) cudaFree(p);
  return r;
}

// What the cache saves, attention only: without a cache, the step recomputes attention of the whole prefix
// (forward causal over L tokens; K/V projections of every layer would come on top). Median of 5.
double recompute_us(int L, Flusher& fl) {
  using namespace flashlite;
  const int64_t Hq = 32, H = 8, D = 128;
  auto* q = dalloc<__nv_bfloat16>(size_t(L * Hq * D));
  auto* k = dalloc<__nv_bfloat16>(size_t(L * H * D));
  auto* v = dalloc<__nv_bfloat16>(size_t(L * H * D));
  auto* o = dalloc<__nv_bfloat16>(size_t(L * Hq * D));
  fill_kernel<<<1024, 256>>>(q, size_t(L * Hq * D), 4);
  fill_kernel<<<1024, 256>>>(k, size_t(L * H * D), 5);
  fill_kernel<<<1024, 256>>>(v, size_t(L * H * D), 6);
  ForwardArgs a;
  a.q = TensorView::contiguous(q, DType::bf16, Device::cuda(0), {1, L, Hq, D});
  a.k = TensorView::contiguous(k, DType::bf16, Device::cuda(0), {1, L, H, D});
  a.v = TensorView::contiguous(v, DType::bf16, Device::cuda(0), {1, L, H, D});
  a.out = TensorView::contiguous(o, DType::bf16, Device::cuda(0), {1, L, Hq, D});
  a.options.causal = true;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    fl.run();
    cudaEventRecord(e0);
    forward(a);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 2) ms.push_back(t);
  }
  ck(cudaGetLastError(), "forward");
  std::sort(ms.begin(), ms.end());
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o)}) cudaFree(p);
  return ms[ms.size() / 2] * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "decode_raw.json";
  int reps = 30;
  bool sweep = false, quick = false, bw_on = true;
  std::vector<Case> only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--sweep") sweep = true;
    else if (a == "--quick") quick = true;
    else if (a == "--no-bw") bw_on = false;
    else if (a == "--max-copies" && i + 1 < argc) g_max_copies = std::atoi(argv[++i]);
#if FLASHLITE_DECODE_TIMELINE
    else if (a == "--timeline") ck(cudaMalloc(&g_timeline, 2 * kTimelineSlotBlocks * flashlite::cuda_decode::kTimelineStamps * 8), "timeline");
#endif
    else if (a == "--only" && i + 1 < argc) {
      const std::string list = argv[++i];
      for (size_t pos = 0; pos < list.size();) {
        size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        Case c{1, 1024, 0};
        int q = 1;
        std::sscanf(list.substr(pos, end - pos).c_str(), "%d:%d:%d:%d", &c.batch, &c.kv_len, &c.page, &q);
        c.q_len = q;
        only.push_back(c);
        pos = end + 1;
      }
    }
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "props");
  Flusher fl;
  const double bw = bw_on ? measure_read_bw(fl.sms, fl.sink) : 3.0;
  const char* commit = std::getenv("FLASHLITE_COMMIT");
  std::printf("device %s, %d SMs, measured read bandwidth %.3f TB/s\n", prop.name, prop.multiProcessorCount, bw);
  FILE* f = std::fopen(out_path.c_str(), "w");
  std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"commit\": \"%s\", \"read_bw_tbps\": %.4f, \"rows\": [\n", prop.name,
               prop.multiProcessorCount, commit ? commit : "unknown", bw);
  bool first = true;
  auto emit = [&](const Case& c, const Result& r, const char* kind) {
    const double bytes = double(c.batch) * c.kv_len * c.hkv * c.d * 2.0 * 2.0;
    const double tbps = bytes / (r.us_median * 1e-6) / 1e12;
    const double tbps_g = r.us_graph > 0 ? bytes / (r.us_graph * 1e-6) / 1e12 : 0;
    std::printf("%-6s b%-3d kv%-6d %-8s q%d splits %-3d %9.2f us [%8.2f, %8.2f]  %6.3f TB/s  %5.1f%% of read bw  cold %9.2f us  "
                "graph %9.2f us %6.3f TB/s %5.1f%%  host %6.2f us  check rel %.1e\n",
                kind, c.batch, c.kv_len, c.page ? ("paged" + std::to_string(c.page)).c_str() : "contig", c.q_len, r.splits,
                r.us_median, r.us_min, r.us_max, tbps, 100 * tbps / bw, r.us_cold, r.us_graph, tbps_g, 100 * tbps_g / bw,
                r.host_us, r.rel_err);
    std::fflush(stdout);
    std::fprintf(f, "%s  {\"kind\": \"%s\", \"batch\": %d, \"kv_len\": %d, \"layout\": \"%s\", \"page_size\": %d, \"q_len\": %d, "
                    "\"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"dtype\": \"bf16\", \"splits\": %d, "
                    "\"us_median\": %.3f, \"us_min\": %.3f, \"us_max\": %.3f, \"kv_bytes\": %.0f, \"tbps\": %.4f, "
                    "\"pct_read_bw\": %.2f, \"us_cold\": %.3f, \"us_graph\": %.3f, \"graph_calls\": %d, \"tbps_graph\": %.4f, "
                    "\"pct_read_bw_graph\": %.2f, \"host_us\": %.3f, \"copies\": %d, \"check_rel_err\": %.3e, \"kernel\": \"%s\"}",
                 first ? "" : ",\n", kind, c.batch, c.kv_len, c.page ? "paged" : "contiguous", c.page, c.q_len, c.hq, c.hkv,
                 c.d, r.splits, r.us_median, r.us_min, r.us_max, bytes, tbps, 100 * tbps / bw, r.us_cold, r.us_graph, r.graph_calls,
                 tbps_g, 100 * tbps_g / bw, r.host_us, r.copies, r.rel_err, r.kernel.c_str());
    first = false;
  };
  std::vector<Case> cases;
  for (int b : {1, 16, 64})
    for (int L : {1024, 8192, 32768})
      for (int page : {0, 16}) cases.push_back({b, L, page});
  for (int page : {64, 256}) cases.push_back({1, 32768, page}), cases.push_back({64, 8192, page});
  cases.push_back({1, 8192, 0, 32, 8, 128, 4});  // speculative decoding: 4 tokens
  cases.push_back({1, 8192, 16, 32, 8, 128, 8});
  if (quick) {
    cases = {{1, 1024, 0},   {1, 8192, 0},   {1, 8192, 16},   {1, 32768, 0},  {1, 32768, 16},
             {16, 8192, 0},  {16, 8192, 16}, {64, 8192, 0},   {64, 8192, 16}, {64, 8192, 256}};
  }
  if (!only.empty()) cases = only;
  for (const Case& c : cases) emit(c, run_case(c, fl, reps, 0, c.batch * size_t(c.kv_len) <= (size_t(1) << 20)), "main");
  for (int L : {1024, 8192, 32768}) {
    if (!only.empty()) break;
    const double us = recompute_us(L, fl);
    std::printf("recompute (causal forward over the prefix, attention only) L %d: %.1f us\n", L, us);
    std::fprintf(f, ",\n  {\"kind\": \"recompute_attention\", \"batch\": 1, \"kv_len\": %d, \"us_median\": %.3f}", L, us);
  }
  if (sweep) {
    for (Case c : {Case{1, 8192, 0}, Case{1, 32768, 0}, Case{1, 32768, 16}, Case{16, 8192, 0}, Case{1, 8192, 16}})
      for (int s : {2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 64}) emit(c, run_case(c, fl, reps / 2 + 5, s, false, false), "sweep");
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
  return 0;
}
