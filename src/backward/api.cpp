// backward(): validates every argument once (the forward's rules for q, k, v, out, lse and the options, then dout and
// the gradient outputs), picks the kernel and runs it.
#include <string>
#include <utility>

#include "backends.h"
#include "common/backward_problem.h"
#include "common/tensor_checks.h"
#include "flashlite/backward.h"
#include "flashlite/errors.h"

namespace flashlite {

using namespace checks;
namespace {

// t must have ref's shape, dtype and device (ref already validated).
void check_like(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
  check_present(t, name);
  check_rank(t, name, 4, "[batch, seq, heads, head_dim]");
  if (t.dtype != ref.dtype) {
    fail_type(std::string(name) + " has dtype " + dtype_name(t.dtype) + " but " + ref_name + " has " +
              dtype_name(ref.dtype) + "; expected the same dtype");
  }
  check_device(t, name, ref.device);
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != ref.shape[i]) {
      fail(std::string(name) + " has shape " + t.shape_string() + "; expected " + ref_name + "'s shape " +
           ref.shape_string());
    }
  }
}

struct Resolved {
  BackwardProblem problem;
  BackwardKernel kernel;
};

Resolved resolve(const BackwardArgs& a, const BackwardOverrides& o) {
  ForwardArgs f;
  f.q = a.q, f.k = a.k, f.v = a.v, f.out = a.out, f.lse = a.lse, f.options = a.options;
  check_present(a.lse, "lse");  // forward treats lse as optional; backward needs it
  BackwardProblem p;
  p.fwd = validate_forward(f);

  check_like(a.dout, "dout", a.out, "out");
  check_like(a.dq, "dq", a.q, "q");
  check_like(a.dk, "dk", a.k, "k");
  check_like(a.dv, "dv", a.v, "v");
  for (auto [t, name] : {std::pair{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}}) check_not_broadcast(*t, name);
  p.dout = a.dout.data;
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  p.dout_stride = row_strides(a.dout, "dout");
  p.dq_stride = row_strides(a.dq, "dq");
  p.dk_stride = row_strides(a.dk, "dk");
  p.dv_stride = row_strides(a.dv, "dv");
  p.k_tensor_rows = a.k.shape[1];
  if (!a.dlse.empty()) {
    check_present(a.dlse, "dlse");
    if (a.dlse.dtype != DType::f32) fail_type(std::string("dlse has dtype ") + dtype_name(a.dlse.dtype) + "; expected float32");
    check_device(a.dlse, "dlse", a.q.device);
    if (a.dlse.rank != 3 || a.dlse.shape[0] != a.lse.shape[0] || a.dlse.shape[1] != a.lse.shape[1] ||
        a.dlse.shape[2] != a.lse.shape[2]) {
      fail("dlse has shape " + a.dlse.shape_string() + "; expected lse's shape " + a.lse.shape_string());
    }
    p.dlse = static_cast<const float*>(a.dlse.data);
    p.dlse_stride = lse_strides(a.dlse);
  }

  const bool has_sink = !a.options.sink_logits.empty();
  if (has_sink != !a.dsink_logits.empty()) {
    fail(has_sink ? "dsink_logits is missing; expected fp32 [q_heads] when sink_logits is given"
                  : "dsink_logits is given without sink_logits; expected it only with learned sink logits");
  }
  if (has_sink) {
    const TensorView& t = a.dsink_logits;
    check_present(t, "dsink_logits");
    if (t.dtype != DType::f32) fail_type(std::string("dsink_logits has dtype ") + dtype_name(t.dtype) + "; expected float32");
    check_device(t, "dsink_logits", a.q.device);
    if (t.rank != 1 || t.shape[0] != a.q.shape[2]) {
      fail("dsink_logits has shape " + t.shape_string() + "; expected [" + std::to_string(a.q.shape[2]) + "] (one per q head)");
    }
    if (t.shape[0] > 1 && t.strides[0] != 1) fail("dsink_logits must be contiguous (stride 1)");
    p.dsink = static_cast<float*>(t.data);
  }

  // The outputs are written while every input is read: no output may share memory with an input or another output.
  const std::pair<const TensorView*, const char*> outputs[] = {
      {&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}, {&a.dsink_logits, "dsink_logits"}};
  const std::pair<const TensorView*, const char*> inputs[] = {
      {&a.q, "q"},     {&a.k, "k"},       {&a.v, "v"},
      {&a.out, "out"}, {&a.lse, "lse"},   {&a.dout, "dout"}, {&a.dlse, "dlse"},
      {&a.options.sink_logits, "sink_logits"}, {&a.options.cu_seqlens_q, "cu_seqlens_q"},
      {&a.options.cu_seqlens_k, "cu_seqlens_k"}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    for (const auto& [t, name] : inputs) check_no_overlap(*outputs[i].first, outputs[i].second, *t, name);
    for (size_t j = i + 1; j < std::size(outputs); ++j) {
      check_no_overlap(*outputs[i].first, outputs[i].second, *outputs[j].first, outputs[j].second);
    }
  }
  p.deterministic = a.deterministic;

  const bool on_cpu = p.fwd.device.type == DeviceType::cpu;
  // CUDA tensors: the Hopper kernels (src/cuda/bwd_hopper/) on sm_90 for the calls they accept, else the mma.sync
  // kernels of src/cuda/bwd/, or a named refusal. Hopper is 1.0-1.7x mma.sync at every measured shape (docs/backward.md).
  const auto cuda_kernel = [&]() -> BackwardKernel {
#if FLASHLITE_WITH_CUDA
    if (std::string why = cuda_backward_unsupported_reason(p); !why.empty()) {
      if (why.rfind("dtype", 0) == 0) fail_type(why);
      fail(why);
    }
    if (o.kernel == BackwardKernel::cuda_mma) return BackwardKernel::cuda_mma;
    const std::string why = cuda_backward_hopper_reject_reason(p);
    if (o.kernel == BackwardKernel::cuda_hopper && !why.empty()) {
      fail("the forced kernel cuda_hopper cannot run this call: " + why);
    }
    return why.empty() ? BackwardKernel::cuda_hopper : BackwardKernel::cuda_mma;
#else
    fail("the tensors are on " + device_name(p.fwd.device) + " but flashlite was built without CUDA");
#endif
  };
  const auto chosen = [&](BackwardKernel k) -> Resolved {
    if (o.kernel != BackwardKernel::automatic && o.kernel != k) {
      fail("the forced backward kernel (BackwardOverrides) does not agree with backend '" +
           std::string(backend_name(a.backend)) + "' on " + device_name(p.fwd.device) + " tensors");
    }
    return {p, k};
  };
  switch (a.backend) {
    case Backend::reference:
      if (!on_cpu) fail("backend 'reference' runs on CPU tensors only; these are on " + device_name(p.fwd.device));
      return chosen(BackwardKernel::reference);
    case Backend::automatic:
    case Backend::cpu:
      if (!on_cpu) {
        if (a.backend == Backend::automatic) return chosen(cuda_kernel());
        fail("backend 'cpu' needs CPU tensors; these are on " + device_name(p.fwd.device));
      }
      if (p.fwd.head_dim > kMaxCpuHeadDim) {
        fail("head_dim " + std::to_string(p.fwd.head_dim) + " is unsupported by backend 'cpu'; expected at most " +
             std::to_string(kMaxCpuHeadDim));
      }
      return chosen(BackwardKernel::cpu_tiled);
    case Backend::cuda:
      if (on_cpu) fail("backend 'cuda' needs CUDA tensors, but the tensors are on cpu");
      return chosen(cuda_kernel());
    case Backend::naive:
      fail("backend 'naive' has no backward; use 'cuda', 'cpu' or 'reference'");
  }
  fail("backend value " + std::to_string(int(a.backend)) + " is unknown");
}

}  // namespace

void backward(const BackwardArgs& args, const BackwardOverrides& overrides) {
  const Resolved r = resolve(args, overrides);
  switch (r.kernel) {
    case BackwardKernel::reference: run_backward_reference(r.problem); return;
    case BackwardKernel::cpu_tiled: run_backward_cpu(r.problem); return;
    case BackwardKernel::cuda_mma:
    case BackwardKernel::cuda_hopper:
#if FLASHLITE_WITH_CUDA
      run_cuda_backward(r.problem, r.kernel == BackwardKernel::cuda_hopper, args.stream, args.workspace,
                        args.workspace_bytes);
      return;
#else
      break;
#endif
    case BackwardKernel::automatic: break;
  }
  throw Error(ErrorKind::runtime, "internal error: no backward kernel for the chosen backend");
}

size_t backward_workspace_bytes(const BackwardArgs& args, const BackwardOverrides& overrides) {
  [[maybe_unused]] const Resolved r = resolve(args, overrides);
#if FLASHLITE_WITH_CUDA
  if (r.kernel == BackwardKernel::cuda_mma || r.kernel == BackwardKernel::cuda_hopper) {
    return cuda_backward_workspace_bytes(r.problem);
  }
#endif
  return 0;
}

std::string backward_kernel_name(const BackwardArgs& args, const BackwardOverrides& overrides) {
  const Resolved r = resolve(args, overrides);
  switch (r.kernel) {
    case BackwardKernel::reference: return "reference_backward_f64";
    case BackwardKernel::cpu_tiled: return "cpu_backward_tiled";
    case BackwardKernel::cuda_mma:
    case BackwardKernel::cuda_hopper:
#if FLASHLITE_WITH_CUDA
      return cuda_backward_kernel_name(r.problem, r.kernel == BackwardKernel::cuda_hopper);
#else
      break;
#endif
    case BackwardKernel::automatic: break;
  }
  return "unknown";
}

void reference_backward_f64(const BackwardArgs& args, double* dq, double* dk, double* dv, double* dsink) {
  BackwardArgs a = args;
  a.backend = Backend::reference;
  const Resolved r = resolve(a, {});
  reference_backward_compute(r.problem, dq, dk, dv, dsink);
}

}  // namespace flashlite
