// The CUDA fused kernels' part of the forward plan (plan_forward in src/dispatch.cpp calls it; prefill from a KV cache
// too): whether they can run a problem, which of the fp32 SIMT, mma.sync and Hopper kernels runs it, its tiles and
// grid order. Every choice between these kernels is made here and nowhere else; FLASHLITE_FWD_HOPPER is read here.
#include <climits>
#include <cstdlib>
#include <string>

#include "backends.h"
#include "cuda/common/device_props.h"
#include "cuda/fwd/fwd_launch.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/errors.h"
#include "kv/kv_problem.h"

namespace flashlite {
namespace {

using cuda_fwd::MmaConfig;
using cuda_fwd::mma_config_info;

bool fits(MmaConfig c, const cuda::DeviceProps& dev) { return mma_config_info(c).smem_bytes <= dev.smem_optin; }

// Tile shapes of the mma.sync kernel per (head_dim, mask, GPU), among FL_FWD_MMA_CONFIGS (the only ones compiled);
// bench/fwd's sweep is the evidence for each pick (docs/performance.md).
MmaConfig mma_tiles(const AttentionProblem& p, const cuda::DeviceProps& dev) {
  const bool masked = cuda_fwd::masked_rows(p.mask);
  switch (p.head_dim) {
    case 32: return MmaConfig::d32_br128_bc128_w4_s2_qreg;
    case 64:  // masked rows waste less of a 64-key tile; full rows run best with FA2's 128 x 128 tile
      return masked ? MmaConfig::d64_br128_bc64_w4_s2_qreg : MmaConfig::d64_br128_bc128_w4_s2;
    case 96: return MmaConfig::d96_br128_bc64_w4_s2;
    case 128:  // 104 KB: A100/H100 class; 99 KB parts (sm_86/89) take the register-Q tile
      return fits(MmaConfig::d128_br128_bc64_w4_s2_f3, dev) ? MmaConfig::d128_br128_bc64_w4_s2_f3
                                                           : MmaConfig::d128_br64_bc64_w4_s2_qreg;
    default:  // 256: 203 KB on H100; elsewhere the small tile
      return dev.cc >= 90 && fits(MmaConfig::d256_br128_bc64_w8_s2, dev) ? MmaConfig::d256_br128_bc64_w8_s2
                                                                         : MmaConfig::d256_br32_bc32_w2_s2;
  }
}

// The cache variant's tiles (prefill), among FL_FWD_CACHE_CONFIGS: the forward's causal tile per head_dim.
MmaConfig cache_tiles(int64_t head_dim, const cuda::DeviceProps& dev) {
  if (head_dim == 64) return MmaConfig::d64_br128_bc64_w4_s2_qreg;
  return fits(MmaConfig::d128_br128_bc64_w4_s2_f3, dev) ? MmaConfig::d128_br128_bc64_w4_s2_f3
                                                        : MmaConfig::d128_br64_bc64_w4_s2_qreg;
}

// FLASHLITE_FWD_HOPPER, read once per process: 0 runs the mma.sync kernel where the Hopper kernel would.
bool hopper_setting_on() {
  static const bool on = cuda_fwd_hopper::parse_fwd_hopper_setting(std::getenv("FLASHLITE_FWD_HOPPER"));
  return on;
}

// Why the KV-cache variant cannot read this cache (empty: it can).
std::string cache_unsupported(const KvCacheDesc& c) {
  if (c.dtype == DType::f32) {
    return "float32 caches are not supported by the fused CUDA kernel; expected float16 or bfloat16 (or a CPU cache)";
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return "head_dim " + std::to_string(c.head_dim) + " has no KV-cache variant of the fused CUDA kernel; expected 64 or 128";
  }
  if (c.paged) {  // the paged loader multiplies page ids and slots by 32-bit strides
    for (int64_t st : {c.ks.batch, c.ks.seq, c.vs.batch, c.vs.seq}) {
      if (st < INT_MIN || st > INT_MAX) {
        return "a paged cache stride of " + std::to_string(st) + " elements is too large for the fused CUDA kernel; "
               "expected page and token strides within 32 bits";
      }
    }
  }
  return {};
}

// Device, compute capability, head_dim, shared memory, lengths and grid: what every fused kernel needs.
std::string common_unsupported(const AttentionProblem& p, const cuda::DeviceProps*& dev) {
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 96 && p.head_dim != 128 && p.head_dim != 256) {
    return "head_dim " + std::to_string(p.head_dim) +
           " is unsupported by the fused CUDA kernel (backend 'cuda'); expected one of 32, 64, 96, 128, 256";
  }
  const int count = cuda::device_count();
  if (count == 0) return "backend 'cuda': no CUDA device is available";
  if (p.device.index < 0 || p.device.index >= count) {
    return "the tensors are on " + device_name(p.device) + " but only " + std::to_string(count) + " CUDA device(s) exist";
  }
  dev = &cuda::device_props(p.device.index);
  if (dev->cc < 80) {
    return "the fused CUDA kernel needs compute capability 8.0 or newer (mma.sync bf16, cp.async); " +
           device_name(p.device) + " has " + std::to_string(dev->cc / 10) + "." + std::to_string(dev->cc % 10);
  }
  if (p.seq_q > INT_MAX || p.seq_k > INT_MAX || p.q_tensor_rows > INT_MAX) {
    return "sequence length " + std::to_string(std::max(p.seq_q, p.seq_k)) +
           " is too long for the fused CUDA kernel; expected at most " + std::to_string(INT_MAX);
  }
  return {};
}

std::string smem_and_grid_unsupported(const AttentionProblem& p, int smem_bytes, int block_rows,
                                      const cuda::DeviceProps& dev) {
  if (smem_bytes > dev.smem_optin) {
    return "head_dim " + std::to_string(p.head_dim) + " needs " + std::to_string(smem_bytes) +
           " bytes of shared memory per block but " + device_name(p.device) + " allows " + std::to_string(dev.smem_optin);
  }
  const int64_t tiles = (p.seq_q + block_rows - 1) / block_rows;
  if (tiles * p.q_heads * p.batch > INT_MAX) {
    return "batch " + std::to_string(p.batch) + " x q_heads " + std::to_string(p.q_heads) + " x query tiles " +
           std::to_string(tiles) + " exceeds the fused CUDA kernel's grid limit of " + std::to_string(INT_MAX) + " blocks";
  }
  return {};
}

FwdPlan unsupported(std::string why) {
  FwdPlan plan;
  plan.unsupported = std::move(why);
  return plan;
}

std::string forced_unsupported(ForwardKernel forced, const std::string& why) {
  return std::string("the forced kernel ") + forward_kernel_kind(forced) + " cannot run these arguments: " + why;
}

}  // namespace

namespace cuda_fwd_hopper {
bool parse_fwd_hopper_setting(const char* value) {
  if (value == nullptr || *value == '\0') return true;
  const std::string v = value;
  if (v == "0" || v == "1") return v == "1";
  throw Error(ErrorKind::invalid_value, "FLASHLITE_FWD_HOPPER=" + v +
                                            ": expected 1 (the default: the Hopper kernel on sm_90 where it can run) or "
                                            "0 (the mma.sync kernel instead)");
}
}  // namespace cuda_fwd_hopper

FwdPlan plan_cuda_fused(const AttentionProblem& p, ForwardKernel forced, const KvCacheDesc* cache) {
  const cuda::DeviceProps* dev = nullptr;
  std::string why = cache ? cache_unsupported(*cache) : std::string();
  if (why.empty()) why = common_unsupported(p, dev);
  if (!why.empty()) return unsupported(forced == ForwardKernel::automatic ? why : forced_unsupported(forced, why));

  FwdPlan plan;
  if (p.dtype == DType::f32) {  // cache variants are 16-bit only (cache_unsupported)
    plan.kernel = ForwardKernel::cuda_simt;
    plan.block_rows = cuda_fwd::simt_f32_block_rows();
  } else {
    const MmaConfig c = cache ? cache_tiles(p.head_dim, *dev) : mma_tiles(p, *dev);
    plan.kernel = ForwardKernel::cuda_mma;
    plan.mma_config = int(c);
    plan.block_rows = mma_config_info(c).block_rows;
  }
  const int smem = plan.kernel == ForwardKernel::cuda_mma ? mma_config_info(MmaConfig(plan.mma_config)).smem_bytes : 0;
  why = smem_and_grid_unsupported(p, smem, plan.block_rows, *dev);
  if (!why.empty()) return unsupported(forced == ForwardKernel::automatic ? why : forced_unsupported(forced, why));

  // The Hopper kernel: on sm_90 in a build with the 90a target, for a problem it accepts, unless FLASHLITE_FWD_HOPPER=0.
  namespace h = cuda_fwd_hopper;
  const std::string hopper_why = cache                   ? "prefill from a KV cache runs the mma.sync kernel"
                                 : !h::hopper_fwd_built() ? "this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)"
                                                          : h::hopper_fwd_reject_reason(p, dev->cc);
  const bool hopper = forced == ForwardKernel::cuda_hopper ||
                      (forced == ForwardKernel::automatic && hopper_why.empty() && hopper_setting_on());
  if (forced == ForwardKernel::cuda_hopper && !hopper_why.empty()) return unsupported(forced_unsupported(forced, hopper_why));
  if (forced == ForwardKernel::cuda_mma && plan.kernel != ForwardKernel::cuda_mma) {
    return unsupported(forced_unsupported(forced, "it takes float16 or bfloat16 only"));
  }
  if (forced == ForwardKernel::cuda_simt && plan.kernel != ForwardKernel::cuda_simt) {
    return unsupported(forced_unsupported(forced, "it takes float32 only"));
  }
  if (hopper) {
    plan.kernel = ForwardKernel::cuda_hopper;
    const h::HopperShape shape = h::hopper_shape(p);
    plan.block_rows = shape.block_rows, plan.p_buffers = shape.p_buffers;
    // Causal block order: rank-major within groups of 8 (sequence, head) pairs (H100: +7% at D64 S1024, up to +47% at
    // D128 S2048 over one group, the group's K/V hit in L2); windows keep one group (their Flex numbers' order).
    plan.rank_group = p.mask.window_left < 0 ? 8 : 0;
  }
  // Tensor-core kernels over rows that may see more than kFoldKeys keys fold O out of the accumulators (fwd_params.h).
  if (plan.kernel != ForwardKernel::cuda_simt && p.seq_k > cuda_fwd::kFoldKeys) {
    const int64_t blocks = (p.seq_q + plan.block_rows - 1) / plan.block_rows * p.q_heads * p.batch;
    plan.fold_bytes = size_t(blocks * cuda_fwd::fold_floats_per_block(plan.block_rows, int(p.head_dim))) * 4;
  }
  return plan;
}

std::string cuda_fused_kernel_name(const AttentionProblem& p, const FwdPlan& plan) {
  const std::string dtype = p.dtype == DType::f16 ? "f16" : p.dtype == DType::bf16 ? "bf16" : "f32";
  switch (plan.kernel) {
    case ForwardKernel::cuda_simt: return "cuda_fused_simt_f32_d" + std::to_string(p.head_dim);
    case ForwardKernel::cuda_hopper:
      return cuda_fwd_hopper::hopper_fwd_kernel_name(p, {plan.block_rows, plan.p_buffers});
    default: return "cuda_fused_mma_" + dtype + "_" + mma_config_info(MmaConfig(plan.mma_config)).name;
  }
}

}  // namespace flashlite
