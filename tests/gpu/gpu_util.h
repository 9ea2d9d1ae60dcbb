#pragma once
// GPU test helpers: device mirrors of the CPU suite's Problem (tests/cpu/test_util.h). A problem is built, filled and
// NaN-poisoned on the host exactly as the CPU tests do; every host buffer is copied to the device byte for byte and
// the views are re-pointed at the same offsets, so the same float64 reference and the same checks (errors, NaN,
// untouched padding bytes, unchanged inputs) apply to the CUDA backend after the bytes are copied back.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_overrides.h"
#include "test_util.h"

namespace fltest {

inline bool has_gpu() {
  static const bool yes = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
  }();
  return yes;
}

#define FL_SKIP_WITHOUT_GPU() \
  if (!::fltest::has_gpu()) GTEST_SKIP() << "no CUDA device"

#define FL_CUDA_OK(call)                                                                              \
  do {                                                                                                \
    const cudaError_t e_ = (call);                                                                    \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);                            \
  } while (0)

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device copies of every host buffer of a Problem; `args` is the problem's ForwardArgs re-pointed to them
// (cu_seqlens stay on the host, as the API wants).
struct DeviceMirror {
  struct Pair {
    Buffer* host;
    void* dev;
  };
  std::vector<Pair> pairs;
  ForwardArgs args;

  explicit DeviceMirror(Problem& p) : args(p.args) {
    for (Buffer* b : {&p.qbuf, &p.kbuf, &p.vbuf, &p.outbuf, &p.lsebuf, &p.sinkbuf}) {
      if (b->bytes.empty()) continue;
      void* d = nullptr;
      cuda_check(cudaMalloc(&d, b->bytes.size()), "cudaMalloc");
      cuda_check(cudaMemcpy(d, b->bytes.data(), b->bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
      pairs.push_back({b, d});
    }
    for (TensorView* t : {&args.q, &args.k, &args.v, &args.out, &args.lse, &args.options.sink_logits}) repoint(*t);
    args.backend = Backend::cuda;
  }
  ~DeviceMirror() {
    for (auto& pr : pairs) cudaFree(pr.dev);
  }
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  // Copies every device buffer back over its host buffer (outputs and, to prove them unchanged, inputs).
  void copy_back() {
    cuda_check(cudaDeviceSynchronize(), "kernel execution");
    for (auto& pr : pairs) {
      cuda_check(cudaMemcpy(pr.host->bytes.data(), pr.dev, pr.host->bytes.size(), cudaMemcpyDeviceToHost),
                 "cudaMemcpy D2H");
    }
  }
  // Re-poisons the device outputs (NaN), e.g. between two runs.
  void poison_outputs(Problem& p) {
    for (auto& pr : pairs) {
      if (pr.host != &p.outbuf && pr.host != &p.lsebuf) continue;
      Buffer tmp(pr.host->dtype, pr.host->numel());
      tmp.poison();
      cuda_check(cudaMemcpy(pr.dev, tmp.bytes.data(), tmp.bytes.size(), cudaMemcpyHostToDevice), "poison");
    }
  }
  void* device_of(const Buffer& b) const {
    for (auto& pr : pairs)
      if (pr.host == &b) return pr.dev;
    return nullptr;
  }

 private:
  void repoint(TensorView& t) {
    if (t.data == nullptr) return;
    const auto* ptr = static_cast<const uint8_t*>(t.data);
    for (auto& pr : pairs) {
      const uint8_t* lo = pr.host->bytes.data();
      if (ptr >= lo && ptr < lo + pr.host->bytes.size()) {
        t.data = static_cast<uint8_t*>(pr.dev) + (ptr - lo);
        t.device = Device::cuda(0);
        return;
      }
    }
    throw std::runtime_error("a view points outside every buffer of the problem");
  }
};

// Tolerances of the correctness protocol (DESIGN.md): fp32 max abs 1e-4; fp16/bf16 relative 1e-2; LSE 1e-4.
inline Tolerance gpu_tolerance(DType) { return Tolerance{1e-4, 1e-2, 1e-4}; }

// Runs the CUDA backend on a problem and checks it against the float64 reference.
inline void run_and_check(const Spec& spec, const std::string& name) {
  Problem p(spec, seed_of(name));
  const Result64 ref = reference64(p);
  const Snapshot before = snapshot(p);
  DeviceMirror m(p);
  suite_forward(m.args);  // under the suite's overrides (test_overrides.h)
  m.copy_back();
  expect_matches(p, ref, before, gpu_tolerance(spec.dtype));
}

// A named problem of a parameterised GPU grid.
struct Case {
  std::string name;
  Spec spec;
};

inline const char* dt_name(DType t) { return t == DType::f32 ? "f32" : t == DType::f16 ? "f16" : "bf16"; }

// Batch 2, dtype t, head_dim d, seq_q x seq_k, hq query heads over hkv KV heads; everything else default.
inline Spec base(DType t, int64_t d, int64_t sq, int64_t sk, int64_t hq, int64_t hkv) {
  Spec s;
  s.dtype = t;
  s.d = d;
  s.batch = 2;
  s.seq_q = sq;
  s.seq_k = sk;
  s.hq = hq;
  s.hkv = hkv;
  return s;
}

// A mask of the fused grids: the mask, learned sink logits, softcap.
struct MaskCase {
  const char* name;
  MaskSpec mask;
  bool sink_logits = false;
  double softcap = 0;
};

// Every mask variant and the combinations that interact (window + sinks, causal + window + sinks, ...).
inline std::vector<MaskCase> mask_cases() {
  return {
      {"none", {}},
      {"causal", {true}},
      {"winleft50", {false, 50, -1, 0}},
      {"winright30", {false, -1, 30, 0}},
      {"win50x30", {false, 50, 30, 0}},
      {"diagonal", {false, 0, 0, 0}},
      {"causal_win64", {true, 64, -1, 0}},
      {"win40_sinks4", {false, 40, -1, 4}},
      {"causal_win100_sinks3", {true, 100, -1, 3}},
      {"causal_win0_sinks70", {true, 0, -1, 70}},
      {"win8x8_sinks2000", {false, 8, 8, 2000}},
      {"sinklogits", {}, true},
      {"causal_sinklogits", {true}, true},
      {"win30_sinklogits", {false, 30, 0, 0}, true},
      {"softcap", {}, false, 5.0},
      {"causal_win70_sinks2_softcap", {true, 70, -1, 2}, true, 20.0},
  };
}

// base() under mask case m, named <dtype>_d<d>_<mask>_q<sq>_k<sk>.
inline Case mask_case(DType t, int64_t d, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, const MaskCase& m) {
  Spec s = base(t, d, sq, sk, hq, hkv);
  s.mask = m.mask;
  s.sink_logits = m.sink_logits;
  s.softcap = m.softcap;
  return {std::string(dt_name(t)) + "_d" + std::to_string(d) + "_" + m.name + "_q" + std::to_string(sq) + "_k" +
              std::to_string(sk),
          s};
}

// Numerics every fused kernel must get right, for dtype t: large logits (the running max), a negative scale, softcap
// with a custom scale. `add(name, spec)` collects them.
template <class Add>
void add_numeric_edge_cases(DType t, Add&& add) {
  Spec s = base(t, 128, 300, 300, 2, 1);
  s.input_std = 4.0;
  add(std::string(dt_name(t)) + "_d128_large_logits", s);
  Spec n = base(t, 64, 200, 200, 2, 1);
  n.scale = -0.3;
  n.mask.causal = true;
  add(std::string(dt_name(t)) + "_d64_negative_scale", n);
  Spec c = base(t, 64, 200, 200, 2, 1);
  c.scale = 0.5;
  c.softcap = 2.0;
  c.input_std = 2.0;
  add(std::string(dt_name(t)) + "_d64_softcap_scale", c);
}

}  // namespace fltest
