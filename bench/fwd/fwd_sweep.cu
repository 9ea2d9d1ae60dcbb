// Tuning sweep of the fused forward kernel: the numbered tile variants of variants.h, each checked against the
// float64 reference on small problems (causal, non-causal, q_len < k_len, window + sinks) before it is timed on the
// reference shapes (bf16, batch * seq = 16384 tokens, heads * head_dim = 2048), side by side with the dispatched
// kernel (flashlite::forward, backend cuda). CUDA events around every call, warm-up first, median of --reps runs,
// inputs rotated across sets so that L2 never holds them. Writes JSON (--out) and prints a table.
//
//   flashlite_fwd_sweep [--seqs 512,1024,...] [--dims 64,128] [--variants 1,2,...] [--reps 30] [--out f.json]
//                       [--commit id] [--no-variants] [--window] [--rank-major 4,11 (the other block order too)]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/problem.h"
#include "cuda/fwd/fwd_launch.h"
#include "flashlite/attention.h"
#include "variants.h"

namespace flashlite::cuda_fwd {
#define FL_DECL(id, d, br, bc, w, s, q, f) void sweep_launch_v##id(const FwdParams&, cudaStream_t);
FL_SWEEP_VARIANTS(FL_DECL)
#undef FL_DECL
}  // namespace flashlite::cuda_fwd

namespace {

using namespace flashlite;
using cuda_fwd::FwdParams;

#define CK(x)                                                                                    \
  do {                                                                                           \
    const cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

struct Variant {
  int id, d, br, bc, warps, stages;
  bool qreg;
  int feat;
  void (*launch)(const FwdParams&, cudaStream_t);
};
const Variant kVariants[] = {
#define FL_ENTRY(id, d, br, bc, w, s, q, f) {id, d, br, bc, w, s, q, f, flashlite::cuda_fwd::sweep_launch_v##id},
    FL_SWEEP_VARIANTS(FL_ENTRY)
#undef FL_ENTRY
};

// Unit-variance pseudo-random bf16 values generated on the device (hash of the index): never zeros.
__global__ void fill_kernel(__nv_bfloat16* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = float(h >> 40) * (1.f / 16777216.f);  // [0, 1)
    x[i] = __float2bfloat16((u - 0.5f) * 3.4641016f);      // uniform with variance 1
  }
}

struct Shape {
  int batch, seq_q, seq_k, hq, hkv, d;
  MaskParams mask;
};

// Contiguous [batch, seq, heads, head_dim] problem on `dev` pointers; lse [batch, hq, seq_q].
AttentionProblem make_problem(const Shape& s, const void* q, const void* k, const void* v, void* out, float* lse) {
  AttentionProblem p;
  p.dtype = DType::bf16;
  p.device = Device::cuda(0);
  p.batch = s.batch;
  p.seq_q = s.seq_q;
  p.seq_k = s.seq_k;
  p.q_heads = s.hq;
  p.kv_heads = s.hkv;
  p.head_dim = s.d;
  p.q_tensor_rows = s.seq_q;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.q_stride = {int64_t(s.seq_q) * s.hq * s.d, int64_t(s.hq) * s.d, s.d};
  p.k_stride = p.v_stride = {int64_t(s.seq_k) * s.hkv * s.d, int64_t(s.hkv) * s.d, s.d};
  p.out_stride = p.q_stride;
  p.lse = lse;
  p.lse_stride = {int64_t(s.hq) * s.seq_q, s.seq_q, 1};
  p.scale = 1.0 / std::sqrt(double(s.d));
  p.mask = s.mask;
  return p;
}

TensorView view(void* data, Device dev, int b, int s, int h, int d) {
  TensorView t = TensorView::contiguous(data, DType::bf16, dev, {b, s, h, d});
  return t;
}

// ---------------------------------------------------------------- correctness check (before timing)

struct CheckResult {
  bool ok = true;
  double worst_rel = 0, worst_lse = 0;
};

CheckResult check_variant(const Variant& v) {
  CheckResult r;
  const Shape cases[] = {
      {2, 333, 333, 4, 2, v.d, {false, -1, -1, 0}},
      {2, 333, 333, 4, 2, v.d, {true, -1, -1, 0}},
      {2, 200, 333, 4, 2, v.d, {true, -1, -1, 0}},
      {2, 333, 333, 4, 2, v.d, {true, 100, -1, 4}},
  };
  std::mt19937 rng(1234 + v.id);
  std::normal_distribution<float> normal;
  for (const Shape& s : cases) {
    const size_t nq = size_t(s.batch) * s.seq_q * s.hq * s.d, nk = size_t(s.batch) * s.seq_k * s.hkv * s.d;
    std::vector<uint16_t> hq(nq), hk(nk), hv(nk), hout(nq);
    for (auto* vec : {&hq, &hk, &hv})
      for (auto& x : *vec) x = float_to_bf16(normal(rng));
    std::vector<double> ref(nq), ref_lse(size_t(s.batch) * s.hq * s.seq_q);
    ForwardArgs a;
    a.q = view(hq.data(), Device::cpu(), s.batch, s.seq_q, s.hq, s.d);
    a.k = view(hk.data(), Device::cpu(), s.batch, s.seq_k, s.hkv, s.d);
    a.v = view(hv.data(), Device::cpu(), s.batch, s.seq_k, s.hkv, s.d);
    a.out = view(hout.data(), Device::cpu(), s.batch, s.seq_q, s.hq, s.d);
    a.options.causal = s.mask.causal;
    a.options.window_left = s.mask.window_left;
    a.options.window_right = s.mask.window_right;
    a.options.sink_tokens = s.mask.sink_tokens;
    reference_forward_f64(a, ref.data(), ref_lse.data());

    void *dq, *dk, *dv, *dout;
    float* dlse;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nk * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, ref_lse.size() * 4));
    CK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, nq * 2));  // NaN poison
    CK(cudaMemset(dlse, 0xff, ref_lse.size() * 4));
    const AttentionProblem p = make_problem(s, dq, dk, dv, dout, dlse);
    v.launch(cuda_fwd::make_fwd_params(p, v.br, true), nullptr);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> lse(ref_lse.size());
    CK(cudaMemcpy(hout.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, lse_err = 0;
    bool finite = true;
    for (size_t i = 0; i < nq; ++i) {
      const double got = bf16_to_float(hout[i]);
      finite = finite && std::isfinite(got);
      num += (got - ref[i]) * (got - ref[i]);
      den += ref[i] * ref[i];
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        finite = finite && lse[i] == float(ref_lse[i]);
      } else {
        finite = finite && std::isfinite(lse[i]);
        lse_err = std::max(lse_err, std::fabs(lse[i] - ref_lse[i]));
      }
    }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    r.worst_rel = std::max(r.worst_rel, rel);
    r.worst_lse = std::max(r.worst_lse, lse_err);
    r.ok = r.ok && finite && rel < 1e-2 && lse_err < 1e-3;
    for (void* ptr : {dq, dk, dv, dout, static_cast<void*>(dlse)}) CK(cudaFree(ptr));
  }
  return r;
}

// ---------------------------------------------------------------- timing

// Median GPU time (microseconds) of `call(set)` over reps runs, rotating input sets; warm-up first.
double median_us(const std::function<void(int)>& call, int sets, int reps) {
  for (int i = 0; i < 3; ++i) call(i % sets);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    call(i % sets);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  std::vector<double> us(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[size_t(i)] = ms * 1e3;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Visible (query, key) pairs of one head of one sequence: the FLOPs of useful work are 4 * pairs * D.
double visible_pairs(const Shape& s) {
  double pairs = 0;
  for (int i = 0; i < s.seq_q; ++i) {
    const int64_t p = i + (s.seq_k - s.seq_q);
    int64_t lo = 0, hi = s.seq_k - 1;
    if (s.mask.causal) hi = std::min<int64_t>(hi, p);
    if (s.mask.window_right >= 0) hi = std::min<int64_t>(hi, p + s.mask.window_right);
    if (s.mask.window_left >= 0) lo = std::max<int64_t>(lo, p - s.mask.window_left);
    double n = hi >= lo ? double(hi - lo + 1) : 0.0;
    // Sink tokens below the window (and allowed by the causal limit).
    const int64_t sink_hi = std::min<int64_t>({int64_t(s.mask.sink_tokens), lo, s.mask.causal ? p + 1 : s.seq_k});
    if (sink_hi > 0) n += double(sink_hi);
    pairs += n;
  }
  return pairs;
}

struct Row {
  std::string label;  // "v3" or "dispatch"
  std::string kernel;
  int variant = 0;
  bool checked = true;
  double rel = 0, us = 0, tflops = 0;
};

const char* fp_order_label(bool rank_major) { return rank_major ? "_rankmajor" : "_pairmajor"; }

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqs = {512, 1024, 2048, 4096, 8192, 16384}, dims = {64, 128}, only, rank_major;
  int reps = 30;
  bool run_variants = true, window = false;
  std::string out_path = "fwd_sweep.json", commit = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--seqs") seqs = parse_list(next), ++i;
    else if (a == "--dims") dims = parse_list(next), ++i;
    else if (a == "--variants") only = parse_list(next), ++i;
    else if (a == "--rank-major") rank_major = parse_list(next), ++i;
    else if (a == "--reps") reps = std::atoi(next), ++i;
    else if (a == "--out") out_path = next, ++i;
    else if (a == "--commit") commit = next, ++i;
    else if (a == "--no-variants") run_variants = false;
    else if (a == "--window") window = true;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // Check every selected variant once per head_dim before any timing.
  std::vector<CheckResult> checks(sizeof(kVariants) / sizeof(kVariants[0]));
  std::vector<bool> selected(checks.size(), false);
  for (size_t i = 0; i < checks.size(); ++i) {
    const Variant& v = kVariants[i];
    selected[i] = run_variants && std::find(dims.begin(), dims.end(), v.d) != dims.end() &&
                  (only.empty() || std::find(only.begin(), only.end(), v.id) != only.end());
    if (!selected[i]) continue;
    checks[i] = check_variant(v);
    std::printf("check v%-2d d%-3d br%-3d bc%-3d w%d s%d %-4s f%d: %s (rel %.2e, lse %.2e)\n", v.id, v.d, v.br, v.bc,
                v.warps, v.stages, v.qreg ? "qreg" : "qsm", v.feat, checks[i].ok ? "ok" : "FAILED", checks[i].worst_rel,
                checks[i].worst_lse);
    std::fflush(stdout);
  }

  FILE* js = std::fopen(out_path.c_str(), "w");
  if (!js) {
    std::perror(out_path.c_str());
    return 1;
  }
  std::fprintf(js, "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"commit\": \"%s\",\n  \"dtype\": \"bf16\",\n", prop.name,
               prop.multiProcessorCount, commit.c_str());
  std::fprintf(js, "  \"protocol\": \"CUDA events per call, median of %d after 3 warm-ups, inputs rotated over >= 2 "
                   "sets; TFLOP/s = 4*B*H*Sq*Sk*D (halved for causal; window rows: visible pairs)\",\n",
               reps);
  std::fprintf(js, "  \"variants\": [\n");
  bool first = true;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (!selected[i]) continue;
    const Variant& v = kVariants[i];
    std::fprintf(js, "%s    {\"id\": %d, \"head_dim\": %d, \"br\": %d, \"bc\": %d, \"warps\": %d, \"stages\": %d, "
                     "\"q_in_registers\": %s, \"feat\": %d, \"check_ok\": %s, \"check_rel_err\": %.3e, \"check_lse_err\": %.3e}",
                 first ? "" : ",\n", v.id, v.d, v.br, v.bc, v.warps, v.stages, v.qreg ? "true" : "false", v.feat,
                 checks[i].ok ? "true" : "false", checks[i].worst_rel, checks[i].worst_lse);
    first = false;
  }
  std::fprintf(js, "\n  ],\n  \"results\": [\n");

  std::vector<Shape> shapes;
  for (int d : dims)
    for (int causal : {0, 1})
      for (int s : seqs) shapes.push_back({16384 / s, s, s, 2048 / d, 2048 / d, d, {causal != 0, -1, -1, 0}});
  if (window) {  // FlexAttention comparison masks: S = 8192, D = 128, causal sliding window 1024, +- 4 sinks
    shapes.push_back({2, 8192, 8192, 16, 16, 128, {true, 1024, -1, 0}});
    shapes.push_back({2, 8192, 8192, 16, 16, 128, {true, 1024, -1, 4}});
  }

  bool first_row = true;
  std::printf("\n%-6s %-4s %-7s %-26s %10s %9s\n", "seq", "d", "mask", "kernel", "us", "TFLOP/s");
  for (const Shape& s : shapes) {
    const size_t nq = size_t(s.batch) * s.seq_q * s.hq * s.d, nk = size_t(s.batch) * s.seq_k * s.hkv * s.d;
    const size_t set_bytes = (nq + 2 * nk) * 2;
    const int sets = std::max<int>(2, int((size_t(4) * prop.l2CacheSize + set_bytes - 1) / set_bytes));
    std::vector<void*> q(static_cast<size_t>(sets)), k(q.size()), v(q.size());
    for (int i = 0; i < sets; ++i) {
      CK(cudaMalloc(&q[size_t(i)], nq * 2));
      CK(cudaMalloc(&k[size_t(i)], nk * 2));
      CK(cudaMalloc(&v[size_t(i)], nk * 2));
      fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q[size_t(i)]), nq, 3 * i + 1);
      fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k[size_t(i)]), nk, 3 * i + 2);
      fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v[size_t(i)]), nk, 3 * i + 3);
    }
    void* out;
    float* lse;
    CK(cudaMalloc(&out, nq * 2));
    CK(cudaMalloc(&lse, size_t(s.batch) * s.hq * s.seq_q * 4));
    CK(cudaDeviceSynchronize());
    const bool plain = s.mask.window_left < 0 && s.mask.sink_tokens == 0;
    const double flops = plain ? 4.0 * s.batch * s.hq * double(s.seq_q) * s.seq_k * s.d * (s.mask.causal ? 0.5 : 1.0)
                               : 4.0 * s.batch * s.hq * visible_pairs(s) * s.d;
    const char* mask_name = !plain ? (s.mask.sink_tokens ? "win+snk" : "window") : s.mask.causal ? "causal" : "full";

    std::vector<Row> rows;
    {  // the dispatched kernel through the public API
      Row r;
      r.label = "dispatch";
      ForwardArgs a;
      a.backend = Backend::cuda;
      a.options.causal = s.mask.causal;
      a.options.window_left = s.mask.window_left;
      a.options.sink_tokens = s.mask.sink_tokens;
      a.out = view(out, Device::cuda(0), s.batch, s.seq_q, s.hq, s.d);
      a.lse = TensorView::contiguous(lse, DType::f32, Device::cuda(0), {s.batch, s.hq, s.seq_q});
      a.q = view(q[0], Device::cuda(0), s.batch, s.seq_q, s.hq, s.d);
      a.k = view(k[0], Device::cuda(0), s.batch, s.seq_k, s.hkv, s.d);
      a.v = view(v[0], Device::cuda(0), s.batch, s.seq_k, s.hkv, s.d);
      r.kernel = forward_kernel_name(a);
      r.us = median_us(
          [&](int set) {
            a.q.data = q[size_t(set)];
            a.k.data = k[size_t(set)];
            a.v.data = v[size_t(set)];
            forward(a);
          },
          sets, reps);
      rows.push_back(r);
    }
    for (size_t i = 0; i < checks.size(); ++i) {
      const Variant& var = kVariants[i];
      if (!selected[i] || var.d != s.d) continue;
      Row r;
      r.label = "v" + std::to_string(var.id);
      r.variant = var.id;
      r.kernel = "br" + std::to_string(var.br) + "_bc" + std::to_string(var.bc) + "_w" + std::to_string(var.warps) +
                 "_s" + std::to_string(var.stages) + (var.qreg ? "_qreg" : "") + "_f" + std::to_string(var.feat);
      r.checked = checks[i].ok;
      r.rel = checks[i].worst_rel;
      if (r.checked) {
        std::vector<FwdParams> params;
        for (int set = 0; set < sets; ++set) {
          params.push_back(cuda_fwd::make_fwd_params(
              make_problem(s, q[size_t(set)], k[size_t(set)], v[size_t(set)], out, lse), var.br, true));
        }
        r.us = median_us([&](int set) { var.launch(params[size_t(set)], nullptr); }, sets, reps);
        if (std::find(rank_major.begin(), rank_major.end(), var.id) != rank_major.end()) {
          rows.push_back(r);  // the same variant with the other block order (make_fwd_params: rank-major iff causal)
          for (auto& fp : params) fp.rank_major = !fp.rank_major;
          r.label += fp_order_label(params[0].rank_major);
          r.us = median_us([&](int set) { var.launch(params[size_t(set)], nullptr); }, sets, reps);
        }
      }
      rows.push_back(r);
    }
    for (Row& r : rows) {
      r.tflops = r.us > 0 ? flops / (r.us * 1e-6) / 1e12 : 0;
      std::printf("%-6d %-4d %-7s %-26s %10.1f %9.1f%s\n", s.seq_q, s.d, mask_name,
                  (r.label + " " + r.kernel).substr(0, 26).c_str(), r.us, r.tflops, r.checked ? "" : "  (check FAILED)");
      std::fprintf(js,
                   "%s    {\"seq\": %d, \"batch\": %d, \"heads\": %d, \"head_dim\": %d, \"causal\": %s, "
                   "\"window_left\": %d, \"sink_tokens\": %d, \"label\": \"%s\", \"kernel\": \"%s\", \"checked\": %s, "
                   "\"us\": %.2f, \"tflops\": %.2f}",
                   first_row ? "" : ",\n", s.seq_q, s.batch, s.hq, s.d, s.mask.causal ? "true" : "false",
                   s.mask.window_left, s.mask.sink_tokens, r.label.c_str(), r.kernel.c_str(),
                   r.checked ? "true" : "false", r.us, r.tflops);
      first_row = false;
    }
    for (int i = 0; i < sets; ++i)
      for (void* ptr : {q[size_t(i)], k[size_t(i)], v[size_t(i)]}) CK(cudaFree(ptr));
    CK(cudaFree(out));
    CK(cudaFree(lse));
  }
  std::fprintf(js, "\n  ]\n}\n");
  std::fclose(js);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
