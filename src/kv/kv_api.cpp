// The public KV-cache entry points (include/flashlite/kv_cache.h): validate once (kv_validate.cpp,
// kv_prefill_validate.cpp), take the requested backend (on_cuda), plan (decode: plan_decode; prefill: the forward's
// CUDA planner), run.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "backends.h"
#include "common/paged.h"
#include "common/tensor_checks.h"
#include "flashlite/errors.h"
#include "flashlite/kv_cache.h"
#include "flashlite/rope.h"
#include "kv/kv_backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace {

using checks::fail;

// Whether the op runs on CUDA (else on the CPU): the cache's device; a backend that contradicts it is a bad argument.
bool on_cuda(Backend requested, Device dev, const char* op) {
  const bool on_cpu = dev.type == DeviceType::cpu;
  switch (requested) {
    case Backend::automatic: break;
    case Backend::cpu:
      if (!on_cpu) fail(std::string(op) + ": backend 'cpu' needs a CPU cache, but the cache is on " + device_name(dev));
      break;
    case Backend::cuda:
      if (on_cpu) fail(std::string(op) + ": backend 'cuda' needs a CUDA cache, but the cache is on cpu");
      break;
    default:
      fail(std::string(op) + ": backend '" + backend_name(requested) + "' is not available; expected auto, cpu or cuda");
  }
  if (on_cpu) return false;
#if FLASHLITE_WITH_CUDA
  return true;
#else
  fail(std::string(op) + ": the cache is on " + device_name(dev) + " but flashlite was built without CUDA");
#endif
}

struct DecodeRun {
  DecodeProblem p;
  bool cuda = false;
  std::string unsupported;  // "decode: why" when no kernel (or not the forced choice) can run it
#if FLASHLITE_WITH_CUDA
  CudaDecodeLaunch launch;
#endif
  size_t workspace = 0;
};

// Validates (throws on a bad argument) and plans under the overrides: the one decode planner.
DecodeRun prepare(const DecodeArgs& args, int64_t bound, const DecodeOverrides& overrides) {
  DecodeRun r;
  r.p = validate_decode(args);
  r.cuda = on_cuda(args.backend, r.p.cache.device, "decode");
  if (bound < 0) bound = r.p.cache.max_length;
  if (bound < r.p.cache.max_length) {
    fail("max_kv_len " + std::to_string(bound) + " is below the longest sequence in the cache (" +
         std::to_string(r.p.cache.max_length) + " tokens)");
  }
  if (overrides.num_splits < 0) {
    fail("num_splits is " + std::to_string(overrides.num_splits) + "; expected 0 (choose) or > 0");
  }
#if FLASHLITE_WITH_CUDA
  if (r.cuda) {
    if (std::string why = cuda_decode_unsupported_reason(r.p); !why.empty()) {
      r.unsupported = "decode: " + why;
      return r;
    }
    // Also sets the kernels' attributes and asks for the cluster size on the first call: planning runs before any
    // graph capture, so a captured decode holds nothing but launches.
    if (std::string why = plan_cuda_decode(r.p, bound, overrides, cuda_decode_device(r.p), r.launch); !why.empty()) {
      r.unsupported = "decode: " + why;
      return r;
    }
    r.workspace = decode_workspace_bytes(r.p, r.launch.splits);
  }
#endif
  return r;
}

// The plan's choices as overrides: decode() with a plan plans again under them (and checks the plan fits the call).
DecodeOverrides overrides_of(const DecodePlan& plan) {
  DecodeOverrides o;
  o.num_splits = plan.num_splits;
  o.merge = plan.cluster_merge ? DecodeMerge::cluster : plan.num_splits > 1 ? DecodeMerge::combine : DecodeMerge::automatic;
  return o;
}

// The call's run: under args.plan (checked against the call) or planned here; throws the reason when unsupported.
DecodeRun prepare_call(const DecodeArgs& args) {
  const DecodePlan* plan = args.plan;
  if (plan && !plan->supported()) fail(plan->unsupported);
  DecodeRun r = plan ? prepare(args, plan->max_kv_len, overrides_of(*plan)) : prepare(args, -1, {});
  if (!r.unsupported.empty()) fail(r.unsupported);
  if (!plan) return r;
  const DecodeProblem& p = r.p;
  if (plan->batch != p.cache.batch || plan->q_len != p.q_len || plan->q_heads != p.q_heads ||
      plan->kv_heads != p.cache.kv_heads || plan->head_dim != p.cache.head_dim || plan->dtype != p.cache.dtype ||
      !(plan->device == p.cache.device)) {
    fail("plan was made for batch " + std::to_string(plan->batch) + ", q_len " + std::to_string(plan->q_len) + ", " +
         std::to_string(plan->q_heads) + "/" + std::to_string(plan->kv_heads) + " heads, head_dim " +
         std::to_string(plan->head_dim) + ", " + dtype_name(plan->dtype) + " on " + device_name(plan->device) +
         "; expected it to match the call (batch " + std::to_string(p.cache.batch) + ", q_len " + std::to_string(p.q_len) +
         ", " + std::to_string(p.q_heads) + "/" + std::to_string(p.cache.kv_heads) + " heads, head_dim " +
         std::to_string(p.cache.head_dim) + ", " + dtype_name(p.cache.dtype) + " on " + device_name(p.cache.device) + ")");
  }
#if FLASHLITE_WITH_CUDA
  if (r.cuda && plan->num_splits != r.launch.splits) {
    fail("plan.num_splits " + std::to_string(plan->num_splits) + " is out of range");
  }
#endif
  return r;
}

}  // namespace

int64_t kv_length(const KvCacheView& c, int64_t b) {
  if (c.layout == KvLayout::contiguous) return static_cast<const int32_t*>(c.host.seq_lens.data)[b];
  const auto* indptr = static_cast<const int32_t*>(c.host.page_indptr.data);
  const int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
  return paged_length<int64_t>(pages, c.k.shape[1], static_cast<const int32_t*>(c.host.last_page_len.data), b);
}

double rope_inv_freq(const RopeOptions& r, int64_t head_dim, int64_t c) { return rope_frequency(r, head_dim, c); }

void append_kv(const AppendArgs& args) {
  const AppendProblem p = validate_append(args);
  const bool cuda = on_cuda(args.backend, p.cache.device, "append_kv");
  if (p.n_new == 0 || p.cache.batch == 0) return;
  if (!cuda) return cpu_kv_append(p);
#if FLASHLITE_WITH_CUDA
  if (std::string why = cuda_append_unsupported_reason(p); !why.empty()) fail("append_kv: " + why);
  run_cuda_append(p, args.stream);
#endif
}

DecodePlan plan_decode(const DecodeArgs& args, int64_t max_kv_len, const DecodeOverrides& overrides) {
  const DecodeRun r = prepare(args, max_kv_len, overrides);
  DecodePlan plan;
  plan.unsupported = r.unsupported;
#if FLASHLITE_WITH_CUDA
  if (r.cuda) {
    plan.num_splits = r.launch.splits;
    plan.cluster_merge = r.launch.cluster_merge;
  }
#endif
  plan.max_kv_len = max_kv_len < 0 ? r.p.cache.max_length : max_kv_len;
  plan.batch = r.p.cache.batch;
  plan.q_len = r.p.q_len;
  plan.q_heads = r.p.q_heads;
  plan.kv_heads = r.p.cache.kv_heads;
  plan.head_dim = r.p.cache.head_dim;
  plan.dtype = r.p.cache.dtype;
  plan.device = r.p.cache.device;
  plan.workspace_bytes = r.workspace;
  return plan;
}

void decode(const DecodeArgs& args) {
  const DecodeRun r = prepare_call(args);
  if (r.cuda && args.workspace != nullptr && args.workspace_bytes < r.workspace) {
    fail("workspace_bytes is " + std::to_string(args.workspace_bytes) + "; expected at least " + std::to_string(r.workspace) +
         " (DecodePlan::workspace_bytes)");
  }
  if (r.p.cache.batch == 0) return;
  if (!r.cuda) return cpu_decode(r.p);
#if FLASHLITE_WITH_CUDA
  run_cuda_decode(r.p, r.launch, args.stream, args.workspace);
#endif
}

namespace {

// A validated prefill problem and its plan: the CPU tiled kernel, or on CUDA the forward's planner for the fused
// kernel's KV-cache variant; unsupported CUDA cases fail here, before anything runs.
struct PrefillRun {
  PrefillProblem p;
  bool cuda = false;
  FwdPlan plan;
};

PrefillRun prepare_prefill(const PrefillArgs& args) {
  PrefillRun r{validate_prefill(args), false, {}};
  r.cuda = on_cuda(args.backend, r.p.cache.device, "prefill");
#if FLASHLITE_WITH_CUDA
  if (r.cuda) {
    r.plan = plan_cuda_fused(r.p.attn, ForwardKernel::automatic, &r.p.cache);
    if (!r.plan.unsupported.empty()) fail("prefill: " + r.plan.unsupported);
  }
#endif
  return r;
}

}  // namespace

void prefill(const PrefillArgs& args) {
  const PrefillRun r = prepare_prefill(args);
  if (r.p.cache.batch == 0 || r.p.attn.seq_q == 0) return;
  if (!r.cuda) return cpu_prefill(r.p);
#if FLASHLITE_WITH_CUDA
  run_cuda_prefill(r.p, r.plan, args.stream);
#endif
}

std::string prefill_kernel_name(const PrefillArgs& args) {
  const PrefillRun r = prepare_prefill(args);
  if (!r.cuda) return std::string("cpu_prefill (") + cpu_simd_name(cpu_simd_default()) + ")";
#if FLASHLITE_WITH_CUDA
  return cuda_prefill_kernel_name(r.p, r.plan);
#else
  return "unknown";
#endif
}

std::string decode_kernel_name(const DecodeArgs& args) {
  const DecodeRun r = prepare_call(args);
  if (!r.cuda) return std::string("cpu_decode (tiled ") + cpu_simd_name(plan_cpu_simd(prefill_from_decode(r.p).attn)) + ")";
#if FLASHLITE_WITH_CUDA
  return cuda_decode_kernel_name(r.p, r.launch);
#else
  return "unknown";
#endif
}

}  // namespace flashlite
