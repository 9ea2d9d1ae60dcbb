// Launch of the fused CUDA forward kernels (src/backends.h) and of prefill from a KV cache (src/kv/kv_prefill.h): the
// same tensor-core kernel with its KV-cache loader. Which kernel and tiles: the plan (src/cuda/fwd/plan.cpp).
//
// Host/device traffic per call: none for padded batches (parameters by value: graph-capturable, no host sync). Varlen
// offsets of up to kInlineSeqs sequences ride inside the kernel parameters too; longer tables go to a per-call device
// buffer (cudaMallocAsync + cudaMemcpyAsync from the host array + cudaFreeAsync, all on the caller's stream): correct
// and asynchronous, but not capturable in a CUDA graph.
//
// Workspace (forward_workspace_bytes = cuda_fused_workspace_bytes):
//   [fold space: plan.fold_bytes, rows past kFoldKeys keys][to a 256-byte boundary][tile counter: 4 bytes]
// the counter present for the Hopper kernel on tiles of unequal work (its dynamic schedule zeroes it on the stream,
// launch_hopper.cu). Without a caller's workspace the bytes the call uses are allocated per call, stream-ordered (the
// counter only where the grid takes the dynamic schedule): memory nodes under graph capture, where a caller's
// workspace gives none.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backends.h"
#include "cuda/common/check.h"
#include "cuda/common/host_copy.h"
#include "cuda/fwd/fwd_launch.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "flashlite/errors.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace cuda_fwd {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(ErrorKind::runtime, std::string("fused attention: ") + what + " failed: " + cudaGetErrorString(e));
  }
}

std::string dtype_tag(DType t) { return t == DType::f16 ? "f16" : t == DType::bf16 ? "bf16" : "f32"; }

constexpr size_t kCounterAlign = 256;  // the tile counter's offset in the workspace: the fold space rounded up to this

// Whether the workspace holds the Hopper kernel's tile counter (the layout above).
bool workspace_has_counter(const AttentionProblem& p, const FwdPlan& plan) {
  return plan.kernel == ForwardKernel::cuda_hopper && uneven_tiles(p.mask, p.varlen());
}

size_t counter_offset(const FwdPlan& plan) {
  return (plan.fold_bytes + kCounterAlign - 1) / kCounterAlign * kCounterAlign;
}

// The layout's bytes: the fold space, and the counter after it when there is one.
size_t workspace_bytes_with(const FwdPlan& plan, bool counter) {
  return counter ? counter_offset(plan) + sizeof(unsigned) : plan.fold_bytes;
}

}  // namespace

FwdParams make_fwd_params(const AttentionProblem& p, int block_rows, bool tensor_cores) {
  FwdParams f;
  cuda::set_attention_tensors(f, p);
  f.batch = int(p.batch);
  f.seq_q = int(p.seq_q);
  f.seq_k = int(p.seq_k);
  f.q_heads = int(p.q_heads);
  f.group = int(p.group_size());
  f.q_tiles = int((p.seq_q + block_rows - 1) / block_rows);
  f.softcap = p.softcap > 0;
  cuda::set_score_scaling(f, p);
  // Causal: heaviest query tiles first (tile rank slowest; mma.sync: over the whole grid, measured 3-10% faster than
  // keeping a head's tiles together); otherwise a head's tiles run side by side (K/V shared in L2).
  f.reverse_tiles = p.mask.causal;
  f.rank_major = p.mask.causal;
  f.rank_group = 0;  // one group; the plan's rank_group for the Hopper kernel (run_cuda_fused)
  f.mask = p.mask;
  const int64_t tb = p.varlen() ? 1 : p.batch;
  if (tensor_cores) {
    f.vec_in = rows_16byte_aligned(p.q, p.q_stride, tb, p.q_heads) &&
               rows_16byte_aligned(p.k, p.k_stride, tb, p.kv_heads) &&
               rows_16byte_aligned(p.v, p.v_stride, tb, p.kv_heads);
    f.vec_out = rows_16byte_aligned(p.out, p.out_stride, tb, p.q_heads);
  }
  return f;
}

}  // namespace cuda_fwd

size_t cuda_fused_workspace_bytes(const AttentionProblem& p, const FwdPlan& plan) {
  using namespace cuda_fwd;
  return workspace_bytes_with(plan, workspace_has_counter(p, plan));
}

void run_cuda_fused(const AttentionProblem& p, const FwdPlan& plan, void* stream_handle, void* workspace,
                    size_t workspace_bytes) {
  using namespace cuda_fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  cuda::DeviceGuard guard(p.device.index);
  FwdParams f = make_fwd_params(p, plan.block_rows, plan.kernel != ForwardKernel::cuda_simt);
  f.rank_group = plan.rank_group;
  // Refused under graph capture before anything is enqueued (the workspace's stream-ordered allocation included).
  const bool varlen_table = p.varlen() && p.batch > kInlineSeqs;
  if (varlen_table) {
    cuda::refuse_host_copy_under_capture(stream, "the varlen offsets of " + std::to_string(p.batch) + " sequences",
                                         true);
  }
  // The caller's workspace, else the bytes allocated here: fold space and tile counter (the layout above), the
  // counter only where the launch's grid takes the dynamic schedule (a call with no more tiles than SMs needs none).
  cuda::CallBuffer scratch(stream);
  bool counter = workspace_has_counter(p, plan);
  if (counter && workspace == nullptr) {
    const int grid = cuda_fwd_hopper::hopper_grid(f, plan.persistent_ctas, int(p.device.index));
    counter = cuda_fwd_hopper::hopper_dynamic_schedule(p, f, grid);
  }
  if (const size_t need = workspace_bytes_with(plan, counter); need > 0) {
    const char* who = plan.fold_bytes == 0 ? "the Hopper kernel's tile counter"
                      : counter ? "the fused kernel over rows past 32768 keys (and its tile counter)"
                                : "the fused kernel over rows past 32768 keys";
    char* ws = cuda::call_workspace(scratch, workspace, workspace_bytes, need, who, "forward_workspace_bytes");
    if (plan.fold_bytes > 0) f.fold = reinterpret_cast<float*>(ws);
    if (counter) f.tile_counter_space = reinterpret_cast<unsigned*>(ws + counter_offset(plan));
  }

  cuda::CallBuffer table(stream);  // varlen offsets past kInlineSeqs
  if (p.varlen()) {
    if (!varlen_table) {
      f.varlen = VarlenMode::inline_table;
      for (int64_t b = 0; b <= p.batch; ++b) {
        f.cu_inline[0][b] = p.cu_seqlens_q[b];
        f.cu_inline[1][b] = p.cu_seqlens_k[b];
      }
    } else {
      f.varlen = VarlenMode::device_table;
      const std::vector<int32_t> host = cuda::varlen_table(p.cu_seqlens_q, p.cu_seqlens_k, p.batch);  // (2, batch + 1)
      const size_t bytes = host.size() * sizeof(int);
      check(cudaMallocAsync(&table.ptr, bytes, stream), "cudaMallocAsync (varlen offsets)");
      // From pageable memory: returns once the bytes are staged, so `host` may go out of scope.
      check(cudaMemcpyAsync(table.ptr, host.data(), bytes, cudaMemcpyHostToDevice, stream), "copying varlen offsets");
      f.cu_dev = static_cast<const int*>(table.ptr);
    }
  }

  switch (plan.kernel) {
    case ForwardKernel::cuda_hopper:
#if defined(FLASHLITE_FWD_HOPPER_BUILT) && FLASHLITE_FWD_HOPPER_BUILT
      // (a throw frees table)
      cuda_fwd_hopper::launch_fwd_hopper(p, f, {plan.block_rows, plan.p_buffers}, plan.persistent_ctas, stream);
#endif
      break;
    case ForwardKernel::cuda_simt: launch_fwd_simt_f32(int(p.head_dim), f, stream); break;
    default:
      if (p.dtype == DType::f16) {
        launch_fwd_mma_f16(MmaConfig(plan.mma_config), f, stream);
      } else {
        launch_fwd_mma_bf16(MmaConfig(plan.mma_config), f, stream);
      }
  }
  const cudaError_t launched = cudaGetLastError();
  check(table.free_now(), "cudaFreeAsync (varlen offsets)");
  check(scratch.free_now(), "cudaFreeAsync (fold space and tile counter)");
  check(launched, "launching the fused attention kernel");
}

std::string cuda_prefill_kernel_name(const PrefillProblem& p, const FwdPlan& plan) {
  using namespace cuda_fwd;
  return std::string("cuda_prefill_") + (p.cache.paged ? "paged_" : "contiguous_") + dtype_tag(p.cache.dtype) + "_" +
         mma_config_info(MmaConfig(plan.mma_config)).name;
}

void run_cuda_prefill(const PrefillProblem& p, const FwdPlan& plan, void* stream_handle) {
  using namespace cuda_fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const KvCacheDesc& c = p.cache;
  const AttentionProblem& a = p.attn;
  cuda::DeviceGuard guard(c.device.index);
  const auto cfg = MmaConfig(plan.mma_config);
  FwdParams f = make_fwd_params(a, mma_config_info(cfg).block_rows, true);
  const int64_t kv_rows = c.paged ? c.num_pages : c.batch;  // what the K/V batch stride steps over
  f.vec_in = rows_16byte_aligned(a.q, a.q_stride, p.ragged() ? 1 : a.batch, a.q_heads) &&
             rows_16byte_aligned(a.k, a.k_stride, kv_rows, c.kv_heads) &&
             rows_16byte_aligned(a.v, a.v_stride, kv_rows, c.kv_heads);
  cuda::set_cache_index(f, c);
  // Refused under graph capture before anything is enqueued (the fold space's stream-ordered allocation included).
  const bool offsets_table = p.ragged() && a.batch > kInlineSeqs;
  if (offsets_table) {
    cuda::refuse_host_copy_under_capture(stream,
                                         "the prefill chunk offsets of " + std::to_string(a.batch) + " sequences",
                                         true);
  }
  cuda::CallBuffer fold(stream);  // caches longer than kFoldKeys: fold space for long rows (fwd_params.h)
  if (plan.fold_bytes > 0) {
    f.fold = reinterpret_cast<float*>(cuda::call_workspace(fold, nullptr, 0, plan.fold_bytes,
                                                           "prefill over caches past 32768 keys", ""));
  }

  cuda::CallBuffer table(stream);  // ragged offsets past kInlineSeqs
  if (p.ragged()) {
    if (!offsets_table) {
      f.varlen = VarlenMode::inline_table;
      for (int64_t b = 0; b <= a.batch; ++b) f.cu_inline[0][b] = a.cu_seqlens_q[b];
    } else {
      f.varlen = VarlenMode::device_table;
      const size_t bytes = size_t(a.batch + 1) * sizeof(int);
      check(cudaMallocAsync(&table.ptr, bytes, stream), "cudaMallocAsync (prefill offsets)");
      check(cudaMemcpyAsync(table.ptr, a.cu_seqlens_q, bytes, cudaMemcpyHostToDevice, stream), "copying prefill offsets");
      f.cu_dev = static_cast<const int*>(table.ptr);
    }
  }
  if (c.dtype == DType::f16) {
    launch_fwd_mma_cache_f16(cfg, f, stream);
  } else {
    launch_fwd_mma_cache_bf16(cfg, f, stream);
  }
  const cudaError_t launched = cudaGetLastError();
  check(table.free_now(), "cudaFreeAsync (prefill offsets)");
  check(fold.free_now(), "cudaFreeAsync (fold space)");
  check(launched, "launching the fused attention kernel (prefill)");
}

}  // namespace flashlite
