#include "attn_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cli_checks.h"
#include "flashlite/dtype.h"
#include "flashlite/errors.h"
#include "flashlite/version.h"
#include "flashlite/tensor.h"
#include "progress.h"

#if FLASHLITE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlite::cli {
namespace {

std::string cuda_device_name() {
  return cuda_device_count() > 0 ? "cuda:0 " + cuda_device_info(0).name : "cuda:0";
}

bool cuda_available() { return cuda_device_count() > 0; }

#if FLASHLITE_WITH_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::runtime, std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// A buffer on the CPU, mirrored on the GPU when the run is on CUDA.
struct Buffer {
  std::vector<uint8_t> host;
  void* device = nullptr;
  bool on_cuda = false;
  Buffer(size_t bytes, bool cuda) : host(bytes), on_cuda(cuda) {
#if FLASHLITE_WITH_CUDA
    if (cuda && bytes) cuda_check(cudaMalloc(&device, bytes), "cudaMalloc");
#endif
  }
  ~Buffer() {
#if FLASHLITE_WITH_CUDA
    if (device) cudaFree(device);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* ptr() { return on_cuda ? device : host.data(); }
  void upload() {
#if FLASHLITE_WITH_CUDA
    if (on_cuda && !host.empty()) cuda_check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
#endif
  }
  void download() {
#if FLASHLITE_WITH_CUDA
    if (on_cuda && !host.empty()) cuda_check(cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost), "download");
#endif
  }
};

DType parse_dtype(const std::string& s, bool cuda) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  return cuda ? DType::bf16 : DType::f32;
}

void fill_random(Buffer& b, DType dtype, int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    switch (dtype) {
      case DType::f32: std::memcpy(b.host.data() + 4 * i, &x, 4); break;
      case DType::f16: { const uint16_t h = float_to_fp16(x); std::memcpy(b.host.data() + 2 * i, &h, 2); break; }
      default: { const uint16_t h = float_to_bf16(x); std::memcpy(b.host.data() + 2 * i, &h, 2); break; }
    }
  }
}

double stored_value(const Buffer& b, DType dtype, int64_t i) {
  if (dtype == DType::f32) { float f; std::memcpy(&f, b.host.data() + 4 * i, 4); return f; }
  uint16_t h;
  std::memcpy(&h, b.host.data() + 2 * i, 2);
  return dtype == DType::f16 ? fp16_to_float(h) : bf16_to_float(h);
}

// Useful FLOPs: 4 * D per visible (query, key) pair (QK^T and PV), counted exactly from the mask.
double useful_flops(const AttnSettings& s, int64_t d, const std::vector<int32_t>& cq, const std::vector<int32_t>& ck,
                    const AttentionOptions& o) {
  double pairs = 0;
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int64_t sq = cq[b + 1] - cq[b], sk = ck[b + 1] - ck[b];
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t p = i + sk - sq;
      int64_t hi = o.causal ? std::min(sk, p + 1) : sk;
      if (o.window_right >= 0) hi = std::min(hi, p + o.window_right + 1);
      const int64_t lo = o.window_left >= 0 ? std::max<int64_t>(0, p - o.window_left) : 0;
      const int64_t win = std::max<int64_t>(0, hi - lo);
      // Sink tokens bypass the window, never the causal limit.
      const int64_t sink_n = std::clamp<int64_t>(std::min<int64_t>(o.sink_tokens, o.causal ? p + 1 : sk), 0, sk);
      const int64_t overlap = win > 0 ? std::max<int64_t>(0, std::min(hi, sink_n) - lo) : 0;
      const double n = double(win + sink_n - overlap);
      pairs += n;
    }
  }
  return pairs * 4.0 * double(d) * double(s.heads);
}

// Refuses, before anything is allocated, a problem whose buffers cannot fit: the host copies of q, k, v, out and lse,
// the float64 check, and what the backend allocates itself (naive: the scores; reference: float64 outputs).
void check_sizes(const AttnSettings& s, int64_t hkv, int64_t seq_k, size_t es, Backend backend, bool on_cuda) {
  const std::string sizes = "--batch " + std::to_string(s.batch) + " --heads " + std::to_string(s.heads) + " --kv-heads " +
                            std::to_string(hkv) + " --seq-q " + std::to_string(s.seq_q) + " --seq-k " + std::to_string(seq_k) +
                            " --head-dim " + std::to_string(s.head_dim);
  constexpr int64_t kInt32Max = 2147483647;
  if (s.varlen && (checked_product({s.batch, s.seq_q}) > kInt32Max || checked_product({s.batch, seq_k}) > kInt32Max)) {
    throw Error(ErrorKind::invalid_value, "--varlen packs up to --batch x --seq-q (or --seq-k) tokens, and cu_seqlens are "
                                          "int32: at most 2147483647 tokens (" + sizes + ")");
  }
  const int64_t nq = checked_product({s.batch, s.seq_q, s.heads, s.head_dim});
  const int64_t nk = checked_product({s.batch, seq_k, hkv, s.head_dim});
  const int64_t rows = checked_product({s.batch, s.heads, s.seq_q});
  const int64_t tensors = checked_sum(checked_product({2, checked_sum(nq, nk), int64_t(es)}), checked_product({rows, 4}));
  int64_t backend_bytes = 0;
  if (backend == Backend::naive) backend_bytes = checked_product({rows, seq_k, 4});
  if (backend == Backend::reference) backend_bytes = checked_product({checked_sum(nq, rows), 8});
  int64_t host = on_cuda ? tensors : checked_sum(tensors, backend_bytes);
  if (s.check) host = checked_sum(host, checked_product({checked_sum(nq, rows), 8 * 2}));  // result + one head's chunk
  require_memory(host, "the buffers of " + sizes + (s.check ? " (with the float64 check)" : ""),
                 "lower one of them" + std::string(s.check ? " or pass --no-check" : ""));
#if FLASHLITE_WITH_CUDA
  if (on_cuda) {
    size_t free_bytes = 0, total = 0;
    const int64_t device = checked_sum(tensors, backend_bytes);
    if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && (device < 0 || device > int64_t(free_bytes))) {
      throw Error(ErrorKind::invalid_value, "the GPU buffers of " + sizes + " would need " +
                                                (device < 0 ? std::string("more than 8 EiB") : format_bytes(device)) + " but " +
                                                format_bytes(int64_t(free_bytes)) + " of GPU memory is free; lower one of them");
    }
  }
#endif
}

// The float64 reference one query head at a time (with its kv head), so that a long check can report progress;
// writes `ref` [tb, rows_q, heads, d] and `ref_lse` [tb, heads, rows_q] as one reference_forward_f64 call would.
void reference_by_head(const ForwardArgs& full, int64_t heads, int64_t hkv, double* ref, double* ref_lse) {
  const int64_t tb = full.q.shape[0], rows_q = full.q.shape[1], rows_k = full.k.shape[1], d = full.q.shape[3];
  const int64_t group = heads / hkv;
  std::vector<double> out(size_t(tb * rows_q * d)), lse(size_t(tb * rows_q));
  Progress progress("checking against the float64 reference");
  auto head_view = [](const TensorView& t, int64_t h, int64_t rows, int64_t d_) {
    const size_t offset = size_t(h * t.strides[2]) * dtype_size(t.dtype);
    return TensorView::strided(static_cast<uint8_t*>(t.data) + offset, t.dtype, t.device, {t.shape[0], rows, 1, d_},
                               {t.strides[0], t.strides[1], t.strides[2], 1});
  };
  for (int64_t h = 0; h < heads; ++h) {
    ForwardArgs a = full;
    a.q = head_view(full.q, h, rows_q, d);
    a.out = head_view(full.out, h, rows_q, d);
    a.k = head_view(full.k, h / group, rows_k, d);
    a.v = head_view(full.v, h / group, rows_k, d);
    const TensorView& l = full.lse;
    a.lse = TensorView::strided(static_cast<float*>(l.data) + h * l.strides[1], DType::f32, l.device, {tb, 1, rows_q},
                                {l.strides[0], l.strides[1], l.strides[2]});
    if (!full.options.sink_logits.empty()) {
      a.options.sink_logits = TensorView::contiguous(static_cast<float*>(full.options.sink_logits.data) + h, DType::f32,
                                                     full.options.sink_logits.device, {1});
    }
    reference_forward_f64(a, out.data(), lse.data());
    for (int64_t b = 0; b < tb; ++b) {
      for (int64_t i = 0; i < rows_q; ++i) {
        std::copy_n(&out[size_t((b * rows_q + i) * d)], d, &ref[size_t(((b * rows_q + i) * heads + h) * d)]);
        ref_lse[size_t((b * heads + h) * rows_q + i)] = lse[size_t(b * rows_q + i)];
      }
    }
    progress.set(double(h + 1) / double(heads));
  }
}

// The times (ms) of the timed runs, after the warm-up runs.
std::vector<double> time_runs(const ForwardArgs& args, const AttnSettings& s, bool on_cuda) {
  std::vector<double> times;
  Progress progress("timing " + std::to_string(s.warmup) + " warm-up + " + std::to_string(s.repeat) + " runs");
  for (int it = 0; it < s.warmup + s.repeat; ++it) {
#if FLASHLITE_WITH_CUDA
    if (on_cuda) cuda_check(cudaDeviceSynchronize(), "sync");
#endif
    const auto t0 = std::chrono::steady_clock::now();
    forward(args);
#if FLASHLITE_WITH_CUDA
    if (on_cuda) cuda_check(cudaDeviceSynchronize(), "attention kernel");
#endif
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= s.warmup) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    progress.set(double(it + 1) / (s.warmup + s.repeat));
  }
  (void)on_cuda;
  return times;
}

}  // namespace

AttnReport run_attention(const AttnSettings& s) {
  const bool has_gpu = cuda_available();
  Backend backend = parse_backend(s.backend);
  // Where the tensors live: reference and cpu run on the CPU; cuda on the GPU; naive and auto follow --device.
  bool on_cuda = false;
  if (backend == Backend::cuda) on_cuda = true;
  else if (backend == Backend::naive || backend == Backend::automatic) on_cuda = s.device == "cuda" || (s.device == "auto" && has_gpu);
  else if (s.device == "cuda") throw Error(ErrorKind::invalid_value, std::string("--backend ") + s.backend + " runs on the CPU, but --device is cuda");
  if (on_cuda && !has_gpu) throw Error(ErrorKind::invalid_value, "backend 'cuda' needs a CUDA device, and none is available");
  const DType dtype = parse_dtype(s.dtype, on_cuda);
  const int64_t hkv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const int64_t seq_k = s.seq_k >= 0 ? s.seq_k : s.seq_q;
  const int64_t d = s.head_dim;
  if (s.heads % hkv != 0) {
    throw Error(ErrorKind::invalid_value, "--heads " + std::to_string(s.heads) + " is not a multiple of --kv-heads " +
                                              std::to_string(hkv) + " (each kv head serves heads / kv_heads query heads)");
  }
  check_sizes(s, hkv, seq_k, dtype_size(dtype), backend, on_cuda);
  std::mt19937_64 rng(s.seed);

  // Sequence layout: padded [batch, seq, h, d], or varlen packed [1, total, h, d] with random lengths.
  std::vector<int32_t> cu_q(size_t(s.batch + 1), 0), cu_k(size_t(s.batch + 1), 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    int64_t lq = s.seq_q, lk = seq_k;
    if (s.varlen) {
      lq = std::uniform_int_distribution<int64_t>(0, s.seq_q)(rng);
      lk = std::uniform_int_distribution<int64_t>(0, seq_k)(rng);
    }
    cu_q[b + 1] = int32_t(cu_q[b] + lq);
    cu_k[b + 1] = int32_t(cu_k[b] + lk);
  }
  const int64_t tb = s.varlen ? 1 : s.batch;
  const int64_t rows_q = s.varlen ? cu_q.back() : s.seq_q;
  const int64_t rows_k = s.varlen ? cu_k.back() : seq_k;
  const Device dev = on_cuda ? Device::cuda(0) : Device::cpu();
  const size_t es = dtype_size(dtype);
  const int64_t nq = tb * rows_q * s.heads * d, nk = tb * rows_k * hkv * d;

  Buffer q(nq * es, on_cuda), k(nk * es, on_cuda), v(nk * es, on_cuda), out(nq * es, on_cuda);
  Buffer lse(size_t(tb * s.heads * rows_q) * 4, on_cuda), sinks(size_t(s.heads) * 4, on_cuda);
  fill_random(q, dtype, nq, rng);
  fill_random(k, dtype, nk, rng);
  fill_random(v, dtype, nk, rng);
  fill_random(sinks, DType::f32, s.heads, rng);
  for (Buffer* b : {&q, &k, &v, &sinks}) b->upload();

  AttentionOptions o;
  o.causal = s.causal;
  if (!s.window.empty()) o.window_left = s.window[0];
  if (s.window.size() > 1) o.window_right = s.window[1];
  o.sink_tokens = s.sink_tokens;
  o.softcap = s.softcap;
  if (s.sink_logits) o.sink_logits = TensorView::contiguous(sinks.ptr(), DType::f32, dev, {s.heads});
  if (s.varlen) {
    o.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::i32, Device::cpu(), {s.batch + 1});
    o.cu_seqlens_k = TensorView::contiguous(cu_k.data(), DType::i32, Device::cpu(), {s.batch + 1});
  }
  auto make_args = [&](bool host) {
    ForwardArgs a;
    const Device dv = host ? Device::cpu() : dev;
    auto pick = [&](Buffer& b) { return host ? static_cast<void*>(b.host.data()) : b.ptr(); };
    a.q = TensorView::contiguous(pick(q), dtype, dv, {tb, rows_q, s.heads, d});
    a.k = TensorView::contiguous(pick(k), dtype, dv, {tb, rows_k, hkv, d});
    a.v = TensorView::contiguous(pick(v), dtype, dv, {tb, rows_k, hkv, d});
    a.out = TensorView::contiguous(pick(out), dtype, dv, {tb, rows_q, s.heads, d});
    a.lse = TensorView::contiguous(pick(lse), DType::f32, dv, {tb, s.heads, rows_q});
    a.options = o;
    if (s.sink_logits) a.options.sink_logits = TensorView::contiguous(pick(sinks), DType::f32, dv, {s.heads});
    return a;
  };
  ForwardArgs args = make_args(false);
  args.backend = backend;

  AttnReport r;
  r.device = on_cuda ? cuda_device_name() : "cpu";
  r.backend = backend_name(backend);
  r.kernel = forward_kernel_name(args);
  r.dtype = dtype_name(dtype);
  r.batch = s.batch; r.heads = s.heads; r.kv_heads = hkv; r.seq_q = s.seq_q; r.seq_k = seq_k; r.head_dim = d;
  r.flops = useful_flops(s, d, cu_q, cu_k, o);

  // Poison the output so unwritten elements fail the check.
  std::fill(out.host.begin(), out.host.end(), uint8_t(0xff));
  std::fill(lse.host.begin(), lse.host.end(), uint8_t(0xff));
  out.upload();
  lse.upload();

  std::vector<double> times = time_runs(args, s, on_cuda);
  std::sort(times.begin(), times.end());
  r.median_ms = times[times.size() / 2];
  r.min_ms = times.front();

  if (s.check) {
    out.download();
    lse.download();
    std::vector<double> ref(static_cast<size_t>(nq)), ref_lse(static_cast<size_t>(tb * s.heads * rows_q));
    reference_by_head(make_args(true), s.heads, hkv, ref.data(), ref_lse.data());
    double num = 0, den = 0, max_abs = 0, lse_abs = 0;
    bool finite = true;
    for (int64_t i = 0; i < nq; ++i) {
      const double got = stored_value(out, dtype, i);
      if (!std::isfinite(got)) finite = false;
      const double e = std::abs(got - ref[i]);
      max_abs = std::max(max_abs, e);
      num += e * e;
      den += ref[i] * ref[i];
    }
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      float got;
      std::memcpy(&got, lse.host.data() + 4 * i, 4);
      if (std::isinf(ref_lse[i])) {
        if (!(std::isinf(got) && got < 0)) finite = false;
        continue;
      }
      if (!std::isfinite(got)) finite = false;
      lse_abs = std::max(lse_abs, std::abs(double(got) - ref_lse[i]));
    }
    r.checked = true;
    r.max_abs_err = max_abs;
    r.rel_err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    r.lse_max_abs_err = lse_abs;
    if (dtype == DType::f32) {
      r.tolerance = "max abs < 1e-4";
      r.passed = finite && max_abs < 1e-4 && lse_abs < 1e-4;
    } else {
      r.tolerance = "rel < 1e-2";
      r.passed = finite && r.rel_err < 1e-2 && lse_abs < 1e-2;
    }
  }
  return r;
}

}  // namespace flashlite::cli
