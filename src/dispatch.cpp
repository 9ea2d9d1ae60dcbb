// The forward op: validates every argument once, plans (plan_forward: the one place that decides which kernel runs,
// whether one can, and what it is called) and runs.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "backends.h"
#include "common/problem.h"
#include "common/tensor_checks.h"
#include "cpu/tiled_kernels.h"
#include "flashlite/attention.h"
#include "flashlite/errors.h"

namespace flashlite {

using namespace checks;

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::reference: return "reference";
    case Backend::naive: return "naive";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "unknown";
}

Backend parse_backend(const std::string& name) {
  for (Backend b : {Backend::automatic, Backend::reference, Backend::naive, Backend::cpu, Backend::cuda}) {
    if (name == backend_name(b)) return b;
  }
  throw Error(ErrorKind::invalid_value,
              "backend '" + name + "' is unknown; expected one of auto, reference, naive, cpu, cuda");
}

namespace {

const int32_t* check_cu_seqlens(const TensorView& t, const char* name, int64_t batch, int64_t rows) {
  if (t.dtype != DType::i32) fail_type(std::string(name) + " has dtype " + dtype_name(t.dtype) + "; expected int32");
  if (t.device.type != DeviceType::cpu) {
    fail(std::string(name) + " is on " + device_name(t.device) + "; expected CPU memory (cumulative offsets are read on the host)");
  }
  if (t.rank != 1) fail(std::string(name) + " has rank " + std::to_string(t.rank) + "; expected rank 1 [batch + 1]");
  if (t.shape[0] != batch + 1) {
    fail(std::string(name) + " has " + std::to_string(t.shape[0]) + " entries; expected " + std::to_string(batch + 1) +
         " (batch + 1, the same as the other cu_seqlens)");
  }
  if (t.shape[0] > 1 && t.strides[0] != 1) fail(std::string(name) + " must be contiguous (stride 1)");
  const auto* cu = static_cast<const int32_t*>(t.data);
  if (cu[0] != 0) fail(std::string(name) + "[0] is " + std::to_string(cu[0]) + "; expected 0");
  for (int64_t i = 1; i <= batch; ++i) {
    if (cu[i] < cu[i - 1]) {
      fail(std::string(name) + " is not monotone: entry " + std::to_string(i) + " is " + std::to_string(cu[i]) +
           " after " + std::to_string(cu[i - 1]));
    }
  }
  if (cu[batch] > rows) {
    fail(std::string(name) + " ends at " + std::to_string(cu[batch]) + ", past the tensor's " + std::to_string(rows) +
         " rows");
  }
  return cu;
}

AttentionProblem validate(const ForwardArgs& a) {
  const AttentionOptions& o = a.options;
  check_present(a.q, "q");
  check_present(a.k, "k");
  check_present(a.v, "v");
  check_present(a.out, "out");
  check_rank(a.q, "q", 4, "[batch, seq_q, q_heads, head_dim]");
  check_rank(a.k, "k", 4, "[batch, seq_k, kv_heads, head_dim]");
  check_rank(a.v, "v", 4, "[batch, seq_k, kv_heads, head_dim]");
  check_rank(a.out, "out", 4, "[batch, seq_q, q_heads, head_dim]");
  check_not_broadcast(a.out, "out");

  if (!is_float_dtype(a.q.dtype)) fail_type(std::string("q has dtype ") + dtype_name(a.q.dtype) + "; expected float32, float16 or bfloat16");
  for (auto [t, name] : {std::pair{&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"}}) {
    if (t->dtype != a.q.dtype) {
      fail_type(std::string(name) + " has dtype " + dtype_name(t->dtype) + " but q has " + dtype_name(a.q.dtype) +
                "; q, k, v and out must share one dtype");
    }
  }
  const Device dev = a.q.device;
  check_device(a.k, "k", dev);
  check_device(a.v, "v", dev);
  check_device(a.out, "out", dev);

  const int64_t batch = a.q.shape[0], seq_q = a.q.shape[1], hq = a.q.shape[2], d = a.q.shape[3];
  const int64_t seq_k = a.k.shape[1], hkv = a.k.shape[2];
  check_dim(a.k, "k", 0, batch, "batch");
  check_dim(a.v, "v", 0, batch, "batch");
  check_dim(a.k, "k", 3, d, "head_dim");
  check_dim(a.v, "v", 1, seq_k, "seq_k");
  check_dim(a.v, "v", 2, hkv, "kv_heads");
  check_dim(a.v, "v", 3, d, "head_dim");
  for (int i = 0; i < 4; ++i) check_dim(a.out, "out", i, a.q.shape[i], i == 0 ? "batch" : i == 1 ? "seq_q" : i == 2 ? "q_heads" : "head_dim");
  if (hq < 1) fail("q has " + std::to_string(hq) + " heads; expected at least 1");
  if (hkv < 1) fail("k has " + std::to_string(hkv) + " heads; expected at least 1");
  if (hq % hkv != 0) {
    fail("q_heads " + std::to_string(hq) + " is not divisible by kv_heads " + std::to_string(hkv) +
         "; GQA needs q_heads to be a multiple of kv_heads");
  }
  if (d < 1) fail("head_dim " + std::to_string(d) + " is unsupported; expected at least 1");

  AttentionProblem p;
  p.dtype = a.q.dtype;
  p.device = dev;
  p.batch = batch;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.head_dim = d;
  p.q_tensor_rows = seq_q;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  p.q_stride = row_strides(a.q, "q");
  p.k_stride = row_strides(a.k, "k");
  p.v_stride = row_strides(a.v, "v");
  p.out_stride = row_strides(a.out, "out");

  check_no_overlap(a.out, "out", a.q, "q");
  check_no_overlap(a.out, "out", a.k, "k");
  check_no_overlap(a.out, "out", a.v, "v");

  // Options.
  if (o.window_left < -1) fail("window_left is " + std::to_string(o.window_left) + "; expected -1 (unlimited) or >= 0");
  if (o.window_right < -1) fail("window_right is " + std::to_string(o.window_right) + "; expected -1 (unlimited) or >= 0");
  if (o.sink_tokens < 0) fail("sink_tokens is " + std::to_string(o.sink_tokens) + "; expected >= 0");
  if (o.scale && !std::isfinite(*o.scale)) fail("scale is " + std::to_string(*o.scale) + "; expected a finite number");
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    fail("softcap is " + std::to_string(o.softcap) + "; expected a finite number >= 0 (0 = off)");
  }
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(d));
  p.softcap = o.softcap;
  p.mask = {o.causal, o.window_left, o.window_right, o.sink_tokens};

  if (!o.sink_logits.empty()) {
    check_present(o.sink_logits, "sink_logits");
    if (o.sink_logits.dtype != DType::f32) fail_type(std::string("sink_logits has dtype ") + dtype_name(o.sink_logits.dtype) + "; expected float32");
    check_device(o.sink_logits, "sink_logits", dev);
    if (o.sink_logits.rank != 1 || o.sink_logits.shape[0] != hq) {
      fail("sink_logits has shape " + o.sink_logits.shape_string() + "; expected [" + std::to_string(hq) + "] (one per q head)");
    }
    if (hq > 1 && o.sink_logits.strides[0] != 1) fail("sink_logits must be contiguous (stride 1)");
    p.sink_logits = static_cast<const float*>(o.sink_logits.data);
    check_no_overlap(a.out, "out", o.sink_logits, "sink_logits");
  }

  // Variable-length batches.
  const bool has_cq = !o.cu_seqlens_q.empty(), has_ck = !o.cu_seqlens_k.empty();
  if (has_cq != has_ck) fail("cu_seqlens_q and cu_seqlens_k must be given together (varlen) or both omitted");
  int64_t lse_batch = batch, lse_seq = seq_q;
  if (has_cq) {
    if (batch != 1) {
      fail("q has batch " + std::to_string(batch) + " with cu_seqlens; varlen expects tensors of shape [1, total_tokens, heads, head_dim]");
    }
    check_present(o.cu_seqlens_q, "cu_seqlens_q");
    check_present(o.cu_seqlens_k, "cu_seqlens_k");
    const int64_t nseq = o.cu_seqlens_q.rank == 1 ? o.cu_seqlens_q.shape[0] - 1 : -1;
    if (nseq < 0) fail("cu_seqlens_q has shape " + o.cu_seqlens_q.shape_string() + "; expected rank 1 [batch + 1] with at least one entry");
    p.cu_seqlens_q = check_cu_seqlens(o.cu_seqlens_q, "cu_seqlens_q", nseq, seq_q);
    p.cu_seqlens_k = check_cu_seqlens(o.cu_seqlens_k, "cu_seqlens_k", nseq, seq_k);
    p.batch = nseq;
    p.seq_q = p.seq_k = 0;
    for (int64_t b = 0; b < nseq; ++b) {
      p.seq_q = std::max<int64_t>(p.seq_q, p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]);
      p.seq_k = std::max<int64_t>(p.seq_k, p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);
    }
  }

  if (!a.lse.empty()) {
    check_present(a.lse, "lse");
    if (a.lse.dtype != DType::f32) fail_type(std::string("lse has dtype ") + dtype_name(a.lse.dtype) + "; expected float32");
    check_device(a.lse, "lse", dev);
    check_rank(a.lse, "lse", 3, has_cq ? "[1, q_heads, total_q]" : "[batch, q_heads, seq_q]");
    check_not_broadcast(a.lse, "lse");
    check_dim(a.lse, "lse", 0, lse_batch, "batch");
    check_dim(a.lse, "lse", 1, hq, "q_heads");
    check_dim(a.lse, "lse", 2, lse_seq, "seq_q");
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_stride = lse_strides(a.lse);
    check_no_overlap(a.lse, "lse", a.q, "q");
    check_no_overlap(a.lse, "lse", a.k, "k");
    check_no_overlap(a.lse, "lse", a.v, "v");
    check_no_overlap(a.lse, "lse", a.out, "out");
  }
  // The outputs must not alias the other inputs the kernels read while writing either.
  for (auto [t, name] : {std::pair{&o.sink_logits, "sink_logits"}, {&o.cu_seqlens_q, "cu_seqlens_q"}, {&o.cu_seqlens_k, "cu_seqlens_k"}}) {
    check_no_overlap(a.out, "out", *t, name);
    check_no_overlap(a.lse, "lse", *t, name);
  }
  return p;
}

// The backend a forced kernel belongs to.
Backend backend_of(ForwardKernel k) {
  switch (k) {
    case ForwardKernel::reference: return Backend::reference;
    case ForwardKernel::cpu_naive:
    case ForwardKernel::cuda_naive: return Backend::naive;
    case ForwardKernel::cpu_tiled: return Backend::cpu;
    case ForwardKernel::cuda_simt:
    case ForwardKernel::cuda_mma:
    case ForwardKernel::cuda_hopper: return Backend::cuda;
    case ForwardKernel::automatic: break;
  }
  return Backend::automatic;
}

bool on_cuda(ForwardKernel k) {
  return k == ForwardKernel::cuda_naive || k == ForwardKernel::cuda_simt || k == ForwardKernel::cuda_mma ||
         k == ForwardKernel::cuda_hopper;
}

FwdPlan kernel_plan(ForwardKernel k) {
  FwdPlan plan;
  plan.kernel = k;
  return plan;
}

FwdPlan unsupported_plan(std::string why) {
  FwdPlan plan;
  plan.unsupported = std::move(why);
  return plan;
}

// ---- The CPU tiled kernel's instruction set. FLASHLITE_CPU_SIMD=portable|avx2|avx512 forces one (the tests cover
// every build this machine can execute that way).

bool cpu_has(CpuSimd simd) {
  if (simd == CpuSimd::avx512) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }
  if (simd == CpuSimd::avx2) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  return true;
}

struct ForcedSimd {
  bool forced = false;
  CpuSimd simd = CpuSimd::portable;
};

// FLASHLITE_CPU_SIMD, read once per process (a bad value throws on every call).
const ForcedSimd& forced_simd() {
  static const ForcedSimd forced = [] {
    const char* e = std::getenv("FLASHLITE_CPU_SIMD");
    const std::string v = e ? e : "";
    if (v.empty()) return ForcedSimd{};
    if (v != "portable" && v != "avx2" && v != "avx512") {
      throw Error(ErrorKind::invalid_value, "FLASHLITE_CPU_SIMD is '" + v + "'; expected portable, avx2 or avx512");
    }
    const CpuSimd simd = v == "avx512" ? CpuSimd::avx512 : v == "avx2" ? CpuSimd::avx2 : CpuSimd::portable;
    if (!cpu_has(simd)) throw Error(ErrorKind::invalid_value, "FLASHLITE_CPU_SIMD=" + v + " but this CPU lacks " + v);
    return ForcedSimd{true, simd};
  }();
  return forced;
}

}  // namespace

// Chosen once per process: a decode step calls the backend once per layer, and reading the variable plus the CPU
// checks were a visible part of a ~5 us call.
CpuSimd cpu_simd_default() {
  static const CpuSimd chosen = [] {
    const ForcedSimd& f = forced_simd();
    if (f.forced) return f.simd;
    return cpu_has(CpuSimd::avx512) ? CpuSimd::avx512 : cpu_has(CpuSimd::avx2) ? CpuSimd::avx2 : CpuSimd::portable;
  }();
  return chosen;
}

// AVX-512 has no small-q (decode) kernels: a call whose tasks are all decode-shaped runs AVX2's, which put keys in the
// vector lanes (measured on a 2-core AVX-512 EPYC, stories260K greedy decode: 17.3k -> 31.5k tok/s), unless
// FLASHLITE_CPU_SIMD forced a level.
CpuSimd plan_cpu_simd(const AttentionProblem& p) {
  const CpuSimd chosen = cpu_simd_default();
  if (cpu_tiled::kernels_of(chosen).small_scores) return chosen;
  static const bool avx2_decode =
      !forced_simd().forced && cpu_has(CpuSimd::avx2) && cpu_tiled::kernels_of(CpuSimd::avx2).small_scores != nullptr;
  if (!avx2_decode) return chosen;
  return cpu_tiled_decode_shaped(p) ? CpuSimd::avx2 : chosen;
}

const char* cpu_simd_name(CpuSimd simd) { return cpu_tiled::kernels_of(simd).name; }

namespace {

FwdPlan cpu_tiled_plan(const AttentionProblem& p) {
  FwdPlan plan = kernel_plan(ForwardKernel::cpu_tiled);
  plan.cpu_simd = plan_cpu_simd(p);
  return plan;
}

// THE forward kernel choice. A backend that contradicts the tensors' device (or the forced kernel) is a bad argument
// (throws); a kernel that cannot run the problem is an answer (the plan's `unsupported`).
FwdPlan plan_problem(const AttentionProblem& p, Backend requested, ForwardKernel forced) {
  const bool on_cpu = p.device.type == DeviceType::cpu;
  const std::string where = device_name(p.device);
  if (forced != ForwardKernel::automatic) {
    const Backend b = backend_of(forced);
    if (requested != Backend::automatic && requested != b) {
      fail(std::string("the forced kernel ") + forward_kernel_kind(forced) + " does not belong to backend '" +
           backend_name(requested) + "'");
    }
    requested = b;
    if (on_cpu == on_cuda(forced)) {
      fail(std::string("the forced kernel ") + forward_kernel_kind(forced) + " needs " + (on_cpu ? "CUDA" : "CPU") +
           " tensors, but the tensors are on " + where);
    }
  }
  switch (requested) {
    case Backend::reference:
      if (!on_cpu) fail("backend 'reference' runs on CPU tensors only, but the tensors are on " + where);
      return kernel_plan(ForwardKernel::reference);
    case Backend::cpu:
      if (!on_cpu) fail("backend 'cpu' needs CPU tensors, but the tensors are on " + where);
      if (p.head_dim > kMaxCpuHeadDim) {
        return unsupported_plan("head_dim " + std::to_string(p.head_dim) + " is unsupported by backend 'cpu'; expected at most " +
                                std::to_string(kMaxCpuHeadDim));
      }
      return cpu_tiled_plan(p);
    case Backend::naive:
      if (on_cpu) return kernel_plan(ForwardKernel::cpu_naive);
#if FLASHLITE_WITH_CUDA
      return kernel_plan(ForwardKernel::cuda_naive);
#else
      return unsupported_plan("the tensors are on " + where + " but flashlite was built without CUDA");
#endif
    case Backend::cuda:
    case Backend::automatic:
      if (on_cpu) {
        if (requested == Backend::cuda) fail("backend 'cuda' needs CUDA tensors, but the tensors are on cpu");
        if (p.head_dim > kMaxCpuHeadDim) {
          return unsupported_plan("head_dim " + std::to_string(p.head_dim) + " is unsupported on the CPU; expected at most " +
                                  std::to_string(kMaxCpuHeadDim));
        }
        return cpu_tiled_plan(p);
      }
#if FLASHLITE_WITH_CUDA
      return plan_cuda_fused(p, forced);
#else
      return unsupported_plan("the tensors are on " + where + " but flashlite was built without CUDA");
#endif
  }
  fail("backend value " + std::to_string(int(requested)) + " is unknown");
}

std::string kernel_name([[maybe_unused]] const AttentionProblem& p, const FwdPlan& plan) {
  switch (plan.kernel) {
    case ForwardKernel::reference: return "reference_f64";
    case ForwardKernel::cpu_naive: return "cpu_naive_three_step";
    case ForwardKernel::cpu_tiled: return std::string("cpu_tiled_") + cpu_simd_name(plan.cpu_simd);
    case ForwardKernel::cuda_naive: return "cuda_naive_split";
#if FLASHLITE_WITH_CUDA
    case ForwardKernel::cuda_simt:
    case ForwardKernel::cuda_mma:
    case ForwardKernel::cuda_hopper: return cuda_fused_kernel_name(p, plan);
#endif
    default: return "unknown";
  }
}

struct Resolved {
  AttentionProblem problem;
  FwdPlan plan;
};

// Validated and planned; throws the reason when nothing (or not the forced kernel) can run the arguments.
// The planner's choice under overrides (validated here: they come from the caller).
FwdPlan plan_with(const AttentionProblem& p, Backend backend, const ForwardOverrides& overrides) {
  if (overrides.persistent_ctas < 0) {
    throw Error(ErrorKind::invalid_value, "ForwardOverrides::persistent_ctas is " +
                                              std::to_string(overrides.persistent_ctas) +
                                              "; expected 0 (the planner's choice) or a positive CTA count");
  }
  FwdPlan plan = plan_problem(p, backend, overrides.kernel);
  plan.persistent_ctas = overrides.persistent_ctas;
  return plan;
}

#if FLASHLITE_WITH_CUDA
// The workspace a CUDA plan takes from the caller (0 for CPU kernels): the naive kernels' scores, the fused kernels'
// fold space and tile counter (cuda_fused_workspace_bytes).
size_t cuda_workspace_bytes(const AttentionProblem& p, const FwdPlan& plan) {
  switch (plan.kernel) {
    case ForwardKernel::cuda_naive: return cuda_naive_workspace_bytes(p);
    case ForwardKernel::cuda_simt:
    case ForwardKernel::cuda_mma:
    case ForwardKernel::cuda_hopper: return cuda_fused_workspace_bytes(p, plan);
    default: return 0;
  }
}
#endif

// Validated and planned; throws the reason when nothing (or not the forced kernel) can run the arguments.
Resolved resolve(const ForwardArgs& args) {
  Resolved r{validate(args), {}};
  r.plan = plan_with(r.problem, args.backend, args.plan ? args.plan->overrides : ForwardOverrides{});
  if (!r.plan.unsupported.empty()) fail(r.plan.unsupported);
  return r;
}

}  // namespace

const char* forward_kernel_kind(ForwardKernel kernel) {
  switch (kernel) {
    case ForwardKernel::automatic: return "automatic";
    case ForwardKernel::reference: return "reference";
    case ForwardKernel::cpu_naive: return "cpu_naive";
    case ForwardKernel::cpu_tiled: return "cpu_tiled";
    case ForwardKernel::cuda_naive: return "cuda_naive";
    case ForwardKernel::cuda_simt: return "cuda_simt";
    case ForwardKernel::cuda_mma: return "cuda_mma";
    case ForwardKernel::cuda_hopper: return "cuda_hopper";
  }
  return "unknown";
}

ForwardPlan plan_forward(const ForwardArgs& args, const ForwardOverrides& overrides) {
  const AttentionProblem p = validate(args);
  const FwdPlan fp = plan_with(p, args.backend, overrides);
  ForwardPlan plan;
  plan.overrides = overrides;
  plan.unsupported = fp.unsupported;
  if (!plan.supported()) return plan;
  plan.kernel = fp.kernel;
  plan.name = kernel_name(p, fp);
#if FLASHLITE_WITH_CUDA
  plan.workspace_bytes = cuda_workspace_bytes(p, fp);
#endif
  return plan;
}

size_t forward_workspace_bytes(const ForwardArgs& args) {
  [[maybe_unused]] const Resolved r = resolve(args);
#if FLASHLITE_WITH_CUDA
  return cuda_workspace_bytes(r.problem, r.plan);
#else
  return 0;
#endif
}

std::string forward_kernel_name(const ForwardArgs& args) {
  const Resolved r = resolve(args);
  return kernel_name(r.problem, r.plan);
}

void forward(const ForwardArgs& args) {
  const Resolved r = resolve(args);
  const AttentionProblem& p = r.problem;
  if (p.batch == 0 || p.seq_q == 0) return;  // nothing to compute
  switch (r.plan.kernel) {
    case ForwardKernel::reference: run_reference(p); return;
    case ForwardKernel::cpu_naive: run_cpu_naive(p); return;
    case ForwardKernel::cpu_tiled: run_cpu_tiled(p, r.plan.cpu_simd); return;
#if FLASHLITE_WITH_CUDA
    case ForwardKernel::cuda_naive: run_cuda_naive(p, args.stream, args.workspace, args.workspace_bytes); return;
    case ForwardKernel::cuda_simt:
    case ForwardKernel::cuda_mma:
    case ForwardKernel::cuda_hopper:
      run_cuda_fused(p, r.plan, args.stream, args.workspace, args.workspace_bytes);
      return;
#endif
    default: break;
  }
  throw Error(ErrorKind::runtime, "internal error: no kernel for the chosen backend");
}

void reference_forward_f64(const ForwardArgs& args, double* out, double* lse) {
  ForwardArgs a = args;
  a.backend = Backend::reference;
  a.plan = nullptr;
  const Resolved r = resolve(a);
  reference_compute(r.problem, out, lse);
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options, Backend backend, void* stream) {
  forward(ForwardArgs{.q = q, .k = k, .v = v, .out = out, .lse = lse, .options = options, .backend = backend,
                      .stream = stream});
}

AttentionProblem validate_forward(const ForwardArgs& args) { return validate(args); }

}  // namespace flashlite
