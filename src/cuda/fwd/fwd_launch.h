#pragma once
// The fused forward kernels' launch interface: the list of tensor-core tile configurations that dispatch may
// pick (each compiled once per 16-bit dtype, nothing else is instantiated) and the per-dtype launchers.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "common/problem.h"
#include "cuda/common/context_cache.h"
#include "cuda/fwd/fwd_params.h"
#include "flashlite/errors.h"

namespace flashlite::cuda_fwd {

// X(name, head_dim, block_rows BR, block_keys BC, warps, stages, q_in_registers, feat) where feat = the kernel's
// optional steps (fwd_mma.cuh: 1 fold scale into exp2, 2 skip rescale, 4 early P pack). Picked from bench/fwd's
// sweep on an H100 (docs/performance.md).
// smem = (STAGES * 2 * BC + (Q in regs and BR <= 2 BC ? 0 : BR)) * (D + 8) * 2 bytes.
#define FL_FWD_MMA_CONFIGS(X)                                     \
  X(d32_br128_bc128_w4_s2_qreg, 32, 128, 128, 4, 2, true, 7)      \
  X(d64_br128_bc64_w4_s2_qreg, 64, 128, 64, 4, 2, true, 7)        \
  X(d64_br128_bc128_w4_s2, 64, 128, 128, 4, 2, false, 7)          \
  X(d96_br128_bc64_w4_s2, 96, 128, 64, 4, 2, false, 7)            \
  X(d128_br128_bc64_w4_s2_f3, 128, 128, 64, 4, 2, false, 3)       \
  X(d128_br64_bc64_w4_s2_qreg, 128, 64, 64, 4, 2, true, 7)        \
  X(d256_br128_bc64_w8_s2, 256, 128, 64, 8, 2, false, 7)          \
  X(d256_br32_bc32_w2_s2, 256, 32, 32, 2, 2, false, 7)

// The configurations that also get a KV-cache variant (prefill: K/V read from a contiguous or paged cache,
// fwd_mma_kernel<..., CACHE = true>): the ones the plan (plan.cpp, cache_tiles) may pick, nothing else, so the
// build stays small. X(name) with a name of FL_FWD_MMA_CONFIGS.
#define FL_FWD_CACHE_CONFIGS(X)  \
  X(d64_br128_bc64_w4_s2_qreg)   \
  X(d128_br128_bc64_w4_s2_f3)    \
  X(d128_br64_bc64_w4_s2_qreg)

enum class MmaConfig : int {
#define FL_FWD_ENUM(name, d, br, bc, w, s, q, f) name,
  FL_FWD_MMA_CONFIGS(FL_FWD_ENUM)
#undef FL_FWD_ENUM
};

struct MmaConfigInfo {
  const char* name;
  int head_dim, block_rows, block_keys, warps, stages;
  bool q_in_registers;
  int smem_bytes;
  int feat;
};

constexpr MmaConfigInfo mma_config_info(MmaConfig c) {
  constexpr MmaConfigInfo table[] = {
#define FL_FWD_INFO(name, d, br, bc, w, s, q, f) \
  {#name, d, br, bc, w, s, q, ((s) * 2 * (bc) + ((q) && (br) <= 2 * (bc) ? 0 : (br))) * ((d) + 8) * 2, f},
      FL_FWD_MMA_CONFIGS(FL_FWD_INFO)
#undef FL_FWD_INFO
  };
  return table[int(c)];
}

// Kernel parameters of a padded problem (varlen tables are filled by run_cuda_fused) for tiles of block_rows rows.
FwdParams make_fwd_params(const AttentionProblem& p, int block_rows, bool tensor_cores);

// Tensor-core launchers (mma_f16.cu, mma_bf16.cu) and the fp32 one (fwd_simt_f32.cu).
void launch_fwd_mma_f16(MmaConfig c, const FwdParams& p, cudaStream_t stream);
void launch_fwd_mma_bf16(MmaConfig c, const FwdParams& p, cudaStream_t stream);
void launch_fwd_simt_f32(int head_dim, const FwdParams& p, cudaStream_t stream);
// KV-cache (prefill) launchers (cache_f16.cu, cache_bf16.cu): c must be one of FL_FWD_CACHE_CONFIGS.
void launch_fwd_mma_cache_f16(MmaConfig c, const FwdParams& p, cudaStream_t stream);
void launch_fwd_mma_cache_bf16(MmaConfig c, const FwdParams& p, cudaStream_t stream);
int simt_f32_block_rows();

// Raises a kernel's dynamic shared-memory limit once per device and context (again after a cudaDeviceReset).
template <class Kernel>
void ensure_smem_optin(Kernel* kernel, int bytes, cuda::PerContextFlag& done) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (done.done(dev)) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    throw Error(ErrorKind::runtime, "fused attention: cannot reserve " + std::to_string(bytes) +
                                        " bytes of shared memory per block: " + cudaGetErrorString(e));
  }
  done.mark(dev);
}

}  // namespace flashlite::cuda_fwd
