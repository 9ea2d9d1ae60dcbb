// The public KV-cache entry points (include/flashlite/kv_cache.h): validate once (kv_validate.cpp,
// kv_prefill_validate.cpp), pick the backend (pick_backend, the one place that decides), plan, run.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "backends.h"
#include "flashlite/errors.h"
#include "flashlite/kv_cache.h"
#include "kv/kv_backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(ErrorKind::invalid_value, msg); }

// true: CUDA kernels; false: the CPU implementation.
bool pick_backend(Backend requested, Device dev, const char* op) {
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
  int splits = 1;
  size_t workspace = 0;
};

#if FLASHLITE_WITH_CUDA
// slots: cuda_decode_slots(p), the device's resident split blocks.
int plan_splits(const DecodeProblem& p, int64_t bound, int forced, int64_t slots) {
  if (forced > 0) return std::min(forced, kDecodeMaxSplits);
  const int64_t rows = p.group() * p.q_len;
  const int64_t units = p.cache.batch * p.cache.kv_heads * ((rows + kDecodeRowsPerBlock - 1) / kDecodeRowsPerBlock);
  return choose_num_splits(units, decode_visible_keys_bound(p.mask, p.q_len, bound), slots, kDecodeTileKeys,
                           kDecodeMaxSplits);
}
#endif

DecodeRun prepare(const DecodeArgs& args, int64_t bound, int forced_splits) {
  DecodeRun r;
  r.p = validate_decode(args);
  r.cuda = pick_backend(args.backend, r.p.cache.device, "decode");
#if FLASHLITE_WITH_CUDA
  if (r.cuda) {
    if (std::string why = cuda_decode_unsupported_reason(r.p); !why.empty()) fail("decode: " + why);
  }
#endif
  if (bound < 0) bound = r.p.cache.max_length;
  if (bound < r.p.cache.max_length) {
    fail("max_kv_len " + std::to_string(bound) + " is below the longest sequence in the cache (" +
         std::to_string(r.p.cache.max_length) + " tokens)");
  }
  if (forced_splits < 0) fail("num_splits is " + std::to_string(forced_splits) + "; expected 0 (choose) or > 0");
#if FLASHLITE_WITH_CUDA
  if (r.cuda) {
    // Also sets the kernels' attributes, asks for the cluster size and reads FLASHLITE_DECODE_CLUSTER on the first
    // call, for a forced split count too: planning runs before any graph capture, so a captured decode holds nothing
    // but launches.
    r.splits = plan_splits(r.p, bound, forced_splits, cuda_decode_slots(r.p));
    r.workspace = decode_workspace_bytes(r.p, r.splits);
  }
#endif
  return r;
}

}  // namespace

int64_t kv_length(const KvCacheView& c, int64_t b) {
  if (c.layout == KvLayout::contiguous) return static_cast<const int32_t*>(c.host.seq_lens.data)[b];
  const auto* indptr = static_cast<const int32_t*>(c.host.page_indptr.data);
  const int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
  return pages == 0 ? 0 : (pages - 1) * c.k.shape[1] + static_cast<const int32_t*>(c.host.last_page_len.data)[b];
}

double rope_inv_freq(const RopeOptions& r, int64_t head_dim, int64_t c) {
  const double inv = std::pow(r.theta, -2.0 * double(c) / double(head_dim));
  if (!r.llama3) return inv;
  const double wavelen = 2.0 * std::numbers::pi / inv;
  const double orig = r.llama3_original_max_position;
  if (wavelen < orig / r.llama3_high_freq_factor) return inv;  // high frequencies: kept
  if (wavelen > orig / r.llama3_low_freq_factor) return inv / r.llama3_factor;  // low frequencies: scaled
  const double smooth = (orig / wavelen - r.llama3_low_freq_factor) / (r.llama3_high_freq_factor - r.llama3_low_freq_factor);
  return (1.0 - smooth) * inv / r.llama3_factor + smooth * inv;
}

void append_kv(const AppendArgs& args) {
  const AppendProblem p = validate_append(args);
  const bool cuda = pick_backend(args.backend, p.cache.device, "append_kv");
  if (p.n_new == 0 || p.cache.batch == 0) return;
  if (!cuda) return cpu_kv_append(p);
#if FLASHLITE_WITH_CUDA
  if (std::string why = cuda_append_unsupported_reason(p); !why.empty()) fail("append_kv: " + why);
  run_cuda_append(p, args.stream);
#endif
}

DecodePlan plan_decode(const DecodeArgs& args, int64_t max_kv_len, int num_splits) {
  const DecodeRun r = prepare(args, max_kv_len, num_splits);
  DecodePlan plan;
  plan.num_splits = r.splits;
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
  DecodeRun r;
  if (const DecodePlan* plan = args.plan) {
    r = prepare(args, plan->max_kv_len, plan->num_splits);
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
    if (r.cuda && plan->num_splits != r.splits) fail("plan.num_splits " + std::to_string(plan->num_splits) + " is out of range");
  } else {
    r = prepare(args, -1, 0);
  }
  if (r.cuda && args.workspace != nullptr && args.workspace_bytes < r.workspace) {
    fail("workspace_bytes is " + std::to_string(args.workspace_bytes) + "; expected at least " + std::to_string(r.workspace) +
         " (DecodePlan::workspace_bytes)");
  }
  if (r.p.cache.batch == 0) return;
  if (!r.cuda) return cpu_decode(r.p);
#if FLASHLITE_WITH_CUDA
  run_cuda_decode(r.p, r.splits, args.stream, args.workspace, args.workspace_bytes);
#endif
}

// Validated prefill problem and its backend (true: CUDA); unsupported CUDA cases fail here, before anything runs.
static std::pair<PrefillProblem, bool> prepare_prefill(const PrefillArgs& args) {
  PrefillProblem p = validate_prefill(args);
  const bool cuda = pick_backend(args.backend, p.cache.device, "prefill");
#if FLASHLITE_WITH_CUDA
  if (cuda) {
    if (std::string why = cuda_prefill_unsupported_reason(p); !why.empty()) fail("prefill: " + why);
  }
#endif
  return {p, cuda};
}

void prefill(const PrefillArgs& args) {
  const auto [p, cuda] = prepare_prefill(args);
  if (p.cache.batch == 0 || p.attn.seq_q == 0) return;
  if (!cuda) return cpu_prefill(p);
#if FLASHLITE_WITH_CUDA
  run_cuda_prefill(p, args.stream);
#endif
}

std::string prefill_kernel_name(const PrefillArgs& args) {
  const auto [p, cuda] = prepare_prefill(args);
  if (!cuda) return std::string("cpu_prefill (") + cpu_tiled_variant() + ")";
#if FLASHLITE_WITH_CUDA
  return cuda_prefill_kernel_name(p);
#else
  return "unknown";
#endif
}

std::string decode_kernel_name(const DecodeArgs& args) {
  const DecodeRun r = args.plan ? prepare(args, args.plan->max_kv_len, args.plan->num_splits) : prepare(args, -1, 0);
  if (!r.cuda) return std::string("cpu_decode (tiled ") + cpu_tiled_variant(prefill_from_decode(r.p).attn) + ")";
#if FLASHLITE_WITH_CUDA
  return cuda_decode_kernel_name(r.p, r.splits);
#else
  return "unknown";
#endif
}

}  // namespace flashlite
