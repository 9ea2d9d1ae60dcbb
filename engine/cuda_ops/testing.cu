#include "engine/cuda_ops/testing.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>

#include "engine/cuda_ops/gemm.h"
#include "engine/cuda_ops/ops.h"
#include "engine/cuda_ops/select.h"
#include "engine/errors.h"
#include "engine/kv_cache.h"
#include "flashlite/kv_cache.h"

namespace flashlite::engine::cuda_ops::testing {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_runtime(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void require_device() {
  if (!device_available()) fail("no CUDA device is available");
}

// Device copy of host data, freed on scope exit.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "malloc"); }
  Dev(const void* host, size_t bytes) : Dev(bytes) {
    if (bytes) check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "upload");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

bool bf16_output(GemvOut e) { return e == GemvOut::bf16 || e == GemvOut::swiglu_bf16; }

}  // namespace

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

void gemv(const GemvParams& shape, const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& xf,
          const std::vector<float>& norm_w, const std::vector<int32_t>& row_index, std::vector<float>& y, int launches,
          bool own_stream) {
  require_device();
  const auto wb = to_bf16(w), xb = to_bf16(x), gb = to_bf16(norm_w);
  Dev dw(wb.data(), wb.size() * 2), dx(xb.data(), xb.size() * 2), dxf(xf.data(), xf.size() * 4),
      dg(gb.data(), gb.size() * 2), dri(row_index.data(), row_index.size() * 4);
  const size_t ny = size_t(shape.rows) * shape.out;
  y.resize(ny);
  const bool b16 = bf16_output(shape.epi);
  Dev dy(ny * (b16 ? 2 : 4));
  if (b16) {
    check(cudaMemset(dy.p, 0xff, ny * 2), "poison");  // NaN where nothing is written
  } else {
    check(cudaMemcpy(dy.p, y.data(), ny * 4, cudaMemcpyHostToDevice), "upload");
  }
  GemvParams p = shape;
  p.w = dw.p;
  p.x = dx.p;
  p.xf = static_cast<const float*>(dxf.p);
  p.norm_w = dg.p;
  p.row_index = row_index.empty() ? nullptr : static_cast<const int32_t*>(dri.p);
  p.y = dy.p;
  cudaStream_t stream = nullptr;
  if (own_stream) check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (int i = 0; i < launches; ++i) cuda_ops::gemv(p, stream);  // back to back: a launch may start before the last ends
  check(own_stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize(), "gemv");
  if (own_stream) cudaStreamDestroy(stream);
  if (b16) {
    std::vector<__nv_bfloat16> out(ny);
    check(cudaMemcpy(out.data(), dy.p, ny * 2, cudaMemcpyDeviceToHost), "download");
    for (size_t i = 0; i < ny; ++i) y[i] = __bfloat162float(out[i]);
  } else {
    check(cudaMemcpy(y.data(), dy.p, ny * 4, cudaMemcpyDeviceToHost), "download");
  }
}

std::vector<std::vector<float>> gemm_sequence(const std::vector<int>& rows_list, int in, int out, bool bf16,
                                              const std::vector<float>& w, const std::vector<float>& x) {
  require_device();
  const int max_rows = int(x.size() / size_t(in));
  std::vector<__nv_bfloat16> wb, xb;
  if (bf16) wb = to_bf16(w), xb = to_bf16(x);
  const size_t elem = bf16 ? 2 : 4;
  Dev dw(bf16 ? static_cast<const void*>(wb.data()) : w.data(), w.size() * elem);
  Dev dx(bf16 ? static_cast<const void*>(xb.data()) : x.data(), x.size() * elem);
  Dev dy(size_t(max_rows) * out * 4);
  Gemm gemm;
  std::vector<std::vector<float>> ys;
  for (int rows : rows_list) {
    if (rows < 1 || rows > max_rows) fail("gemm_sequence: row count outside [1, rows of x]");
    gemm.run(dy.p, dx.p, dw.p, rows, in, out, bf16 ? Elem::bf16 : Elem::f32, true, nullptr);
    std::vector<float> y(size_t(rows) * out);
    check(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), "download");
    ys.push_back(std::move(y));
  }
  return ys;
}

namespace {
double time_gemv(const GemvParams& shape, int iters, bool stream) {
  require_device();
  const int wrows = shape.epi == GemvOut::swiglu_bf16 ? 2 * shape.out : shape.out;
  const size_t nw = size_t(wrows) * shape.k, nx = size_t(shape.rows) * shape.k;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> host(std::max(nx, size_t(shape.k)));
  for (float& v : host) v = u(rng);
  const auto hb = to_bf16(host);
  // Enough copies of the weights (>= 128 MB together, up to 16) that each launch streams its matrix from memory,
  // not from the 50 MB L2 a previous launch left it in.
  const size_t copies = std::min<size_t>(16, std::max<size_t>(1, ((size_t(128) << 20) + nw * 2 - 1) / (nw * 2)));
  Dev dw(copies * nw * 2), dx(hb.data(), nx * 2), dxf(host.data(), nx * 4), dg(hb.data(), size_t(shape.k) * 2),
      dy(size_t(shape.rows) * shape.out * 4);
  check(cudaMemset(dw.p, 0x3c, copies * nw * 2), "fill");  // bf16 0x3c3c ~ 0.0115
  check(cudaMemset(dy.p, 0, size_t(shape.rows) * shape.out * 4), "fill");
  GemvParams p = shape;
  p.w = dw.p;
  p.x = dx.p;
  p.xf = static_cast<const float*>(dxf.p);
  p.norm_w = dg.p;
  p.row_index = nullptr;
  p.y = dy.p;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  const int reps = stream ? 5 : iters;
  for (int i = 0; i < reps + 3; ++i) {
    cudaEventRecord(a);
    for (int j = 0; j < (stream ? iters : 1); ++j) {
      p.w = static_cast<const char*>(dw.p) + ((size_t(i) * iters + j) % copies) * nw * 2;
      cuda_ops::gemv(p, nullptr);
    }
    cudaEventRecord(b);
    check(cudaEventSynchronize(b), "timing");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i >= 3) ms.push_back(stream ? t / iters : t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

}  // namespace

double gemv_time_us(const GemvParams& shape, int iters) { return time_gemv(shape, iters, false); }
double gemv_back_to_back_time_us(const GemvParams& shape, int iters) { return time_gemv(shape, iters, true); }

void gemv_rope(const GemvParams& shape, bool fused, const std::vector<float>& w, const std::vector<float>& xf,
               const std::vector<float>& norm_w, double theta, int positions, const std::vector<int32_t>& pos,
               std::vector<float>& y, std::vector<float>& k_cache, std::vector<float>& v_cache) {
  require_device();
  const GemvRope& r = shape.rope;
  const int D = r.head_dim, kvd = r.kv_heads * D, qd = r.heads * D, rows = shape.rows;
  RopeOptions rope;
  rope.enabled = true;
  rope.theta = theta;
  rope.layout = r.interleaved ? RopeLayout::interleaved : RopeLayout::half_split;
  std::vector<int64_t> cache_row(rows);
  std::vector<int32_t> lens(rows);
  for (int i = 0; i < rows; ++i) {
    cache_row[i] = int64_t(i) * positions + pos[i];
    lens[i] = pos[i] + 1;
  }
  const auto wb = to_bf16(w), gb = to_bf16(norm_w);
  Dev dw(wb.data(), wb.size() * 2), dxf(xf.data(), xf.size() * 4), dg(gb.data(), gb.size() * 2),
      dpos(pos.data(), pos.size() * 4), drow(cache_row.data(), cache_row.size() * 8), dlens(lens.data(), lens.size() * 4);
  const size_t ny = size_t(rows) * shape.out, nc = size_t(rows) * positions * kvd, half = size_t(D / 2);
  Dev dy(ny * 2), dk(nc * 2), dv(nc * 2), dcos(size_t(positions) * half * 4), dsin(size_t(positions) * half * 4);
  check(cudaMemset(dy.p, 0xff, ny * 2), "poison");
  check(cudaMemset(dk.p, 0xff, nc * 2), "poison");
  check(cudaMemset(dv.p, 0xff, nc * 2), "poison");
  GemvParams p = shape;
  p.w = dw.p;
  p.in = GemvIn::rmsnorm;
  p.xf = static_cast<const float*>(dxf.p);
  p.norm_w = dg.p;
  p.row_index = nullptr;
  p.y = dy.p;
  if (fused) {
    rope_tables(static_cast<float*>(dcos.p), static_cast<float*>(dsin.p), rope, positions, D);
    p.epi = GemvOut::rope_bf16;
    p.rope.cos = static_cast<const float*>(dcos.p);
    p.rope.sin = static_cast<const float*>(dsin.p);
    p.rope.pos = static_cast<const int32_t*>(dpos.p);
    p.rope.cache_row = static_cast<const int64_t*>(drow.p);
    p.rope.k_cache = dk.p;
    p.rope.v_cache = dv.p;
    cuda_ops::gemv(p, nullptr);
  } else {
    p.epi = GemvOut::bf16;
    cuda_ops::gemv(p, nullptr);
    int cur = 0;
    check(cudaGetDevice(&cur), "device");
    const KvCacheShape ks{1, rows, positions, r.kv_heads, D};
    auto cols = [&](int col, int heads) {
      return TensorView::strided(static_cast<char*>(dy.p) + size_t(col) * 2, DType::bf16, Device::cuda(cur),
                                 {rows, 1, heads, D}, {shape.out, shape.out, D, 1});
    };
    AppendArgs ap;
    ap.cache = kv_cache_view(ks, dk.p, dv.p, DType::bf16, Device::cuda(cur), 0, rows, lens.data(),
                             static_cast<const int32_t*>(dlens.p));
    ap.k = cols(qd, r.kv_heads);
    ap.v = cols(qd + kvd, r.kv_heads);
    ap.q = cols(0, r.heads);
    ap.q_out = ap.q;
    ap.rope = rope;
    ap.backend = Backend::cuda;
    append_kv(ap);
  }
  check(cudaDeviceSynchronize(), "gemv_rope");
  auto down = [](const Dev& d, size_t n, std::vector<float>& out) {
    std::vector<__nv_bfloat16> b(n);
    check(cudaMemcpy(b.data(), d.p, n * 2, cudaMemcpyDeviceToHost), "download");
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(b[i]);
  };
  down(dy, ny, y);
  down(dk, nc, k_cache);
  down(dv, nc, v_cache);
}

std::vector<int32_t> gemv_argmax(const GemvParams& shape, const std::vector<float>& w, const std::vector<float>& xf,
                                 const std::vector<float>& norm_w, const std::vector<int32_t>& row_index,
                                 std::vector<float>& y, std::vector<uint64_t>* keys_out) {
  require_device();
  const auto wb = to_bf16(w), gb = to_bf16(norm_w);
  Dev dw(wb.data(), wb.size() * 2), dxf(xf.data(), xf.size() * 4), dg(gb.data(), gb.size() * 2),
      dri(row_index.data(), row_index.size() * 4), dkeys(size_t(shape.rows) * 8);
  const size_t ny = size_t(shape.rows) * shape.out;
  Dev dy(ny * 4);
  check(cudaMemset(dy.p, 0xff, ny * 4), "poison");
  check(cudaMemset(dkeys.p, 0xff, size_t(shape.rows) * 8), "poison");
  // The embedding kernel zeroes the keys on its way (a one-row table and token 0).
  const std::vector<__nv_bfloat16> table(8, __float2bfloat16(1.f));
  const int32_t token = 0;
  Dev dtable(table.data(), table.size() * 2), dtok(&token, 4), dx(8 * 4);
  embed(static_cast<float*>(dx.p), dtable.p, static_cast<const int32_t*>(dtok.p), 1, 8, Elem::bf16, nullptr,
        static_cast<uint64_t*>(dkeys.p), shape.rows);
  GemvParams p = shape;
  p.w = dw.p;
  p.in = GemvIn::rmsnorm;
  p.xf = static_cast<const float*>(dxf.p);
  p.norm_w = dg.p;
  p.row_index = row_index.empty() ? nullptr : static_cast<const int32_t*>(dri.p);
  p.epi = GemvOut::f32_argmax;
  p.y = dy.p;
  p.argmax_keys = static_cast<uint64_t*>(dkeys.p);
  cuda_ops::gemv(p, nullptr);
  check(cudaDeviceSynchronize(), "gemv_argmax");
  y.resize(ny);
  check(cudaMemcpy(y.data(), dy.p, ny * 4, cudaMemcpyDeviceToHost), "download");
  std::vector<uint64_t> keys(shape.rows);
  check(cudaMemcpy(keys.data(), dkeys.p, keys.size() * 8, cudaMemcpyDeviceToHost), "download");
  std::vector<int32_t> ids(shape.rows);
  for (int r = 0; r < shape.rows; ++r) ids[r] = argmax_key_index(keys[r]);
  if (keys_out) *keys_out = keys;
  return ids;
}

std::vector<uint64_t> argmax_keys(const std::vector<float>& logits, int rows, int vocab) {
  require_device();
  Dev dl(logits.data(), logits.size() * 4), dk(size_t(rows) * 8);
  check(cudaMemset(dk.p, 0xff, size_t(rows) * 8), "poison");
  cuda_ops::argmax_rows(static_cast<uint64_t*>(dk.p), static_cast<const float*>(dl.p), rows, vocab, nullptr);
  std::vector<uint64_t> keys(rows);
  check(cudaMemcpy(keys.data(), dk.p, size_t(rows) * 8, cudaMemcpyDeviceToHost), "download");
  return keys;
}

std::vector<int32_t> argmax_rows(const std::vector<float>& logits, int rows, int vocab) {
  const std::vector<uint64_t> keys = argmax_keys(logits, rows, vocab);
  std::vector<int32_t> ids(rows);
  for (int r = 0; r < rows; ++r) ids[r] = argmax_key_index(keys[r]);
  return ids;
}

void top_k_rows(const std::vector<float>& logits, int rows, int vocab, int k, std::vector<float>& values,
                std::vector<int32_t>& ids) {
  require_device();
  Dev dl(logits.data(), logits.size() * 4), dv(size_t(rows) * k * 4), di(size_t(rows) * k * 4);
  check(cudaMemset(dv.p, 0xff, size_t(rows) * k * 4), "poison");
  check(cudaMemset(di.p, 0xff, size_t(rows) * k * 4), "poison");
  cuda_ops::top_k_rows(static_cast<float*>(dv.p), static_cast<int32_t*>(di.p), static_cast<const float*>(dl.p), rows,
                       vocab, k, nullptr);
  values.resize(size_t(rows) * k);
  ids.resize(size_t(rows) * k);
  check(cudaMemcpy(values.data(), dv.p, values.size() * 4, cudaMemcpyDeviceToHost), "download");
  check(cudaMemcpy(ids.data(), di.p, ids.size() * 4, cudaMemcpyDeviceToHost), "download");
}

}  // namespace flashlite::engine::cuda_ops::testing
