// Host side of CUDA decode: what the kernels support, what the device offers them (resident blocks, cluster size; the
// plan's inputs, src/kv/kv_plan.cpp) and the launch of a plan (split kernel, then, when split and not merged in a
// cluster, the combine kernel, as programmatic dependent launches on sm_90).
// Nothing here synchronises with the device or reads device memory: a decode step can be captured in a CUDA graph
// (with a caller-provided workspace; without one, the per-call cudaMallocAsync/cudaFreeAsync are captured too).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/context_cache.h"
#include "cuda/common/device_props.h"
#include "cuda/common/host_copy.h"
#include "cuda/common/kernel_arch.h"
#include "cuda/decode/cluster_merge.cuh"
#include "cuda/decode/decode_kernels.h"
#include "cuda/decode/decode_params.h"
#include "flashlite/errors.h"
#include "kv/kv_backends.h"

namespace flashlite {
namespace {

using cuda_decode::DecodeKernels;
using cuda_decode::DecodeParams;

constexpr int kSplitThreads = 128;
constexpr int kCombineThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

DecodeKernels kernels_for(const DecodeProblem& p) {
  return p.cache.dtype == DType::bf16 ? cuda_decode::decode_kernels_bf16(int(p.cache.head_dim))
                                      : cuda_decode::decode_kernels_f16(int(p.cache.head_dim));
}

int64_t row_chunks(const DecodeProblem& p) {
  return (p.group() * p.q_len + kDecodeRowsPerBlock - 1) / kDecodeRowsPerBlock;
}

bool aligned16(const void* ptr, const RowStrides& s) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.batch % 8 == 0 && s.seq % 8 == 0 && s.head % 8 == 0;
}

// Per device and kernel instance: the opt-in shared memory being set and its resident blocks per SM, the cluster size
// and whether its sm_90 code runs (cached; attribute calls never synchronise).
struct KernelState {
  std::atomic<int> blocks_per_sm{0};    // 0: not prepared yet (stored last: the fields below are set by then)
  std::atomic<int> cluster_splits{0};   // largest cluster of split CTAs that fits the device (0: none)
  std::atomic<bool> sm90_code{false};   // sm_90 device and code with griddepcontrol / clusters (kernel_arch.h)
  std::atomic<uint64_t> context{0};     // the context the attributes were set in (cudaDeviceReset makes a new one)
};
KernelState g_state[64][4];  // device x (dtype, head_dim) instance

int instance_index(const DecodeProblem& p) { return (p.cache.dtype == DType::bf16 ? 0 : 2) + (p.cache.head_dim == 64 ? 0 : 1); }

// The largest cluster of split CTAs (kClusterMaxSplits down to 2) with at least one resident cluster on the device.
int query_cluster_splits(const DecodeKernels& k) {
  FL_CUDA_CHECK(cudaFuncSetAttribute(k.split, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int c = cuda_decode::kClusterMaxSplits; c >= 2; c /= 2) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(c), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(c));
    cfg.blockDim = dim3(kSplitThreads);
    cfg.dynamicSmemBytes = size_t(k.split_smem_bytes);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, k.split, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // an unsupported size is an answer here, not a sticky error
    } else if (clusters >= 1) {
      return c;
    }
  }
  return 0;
}

// Prepares the split kernel on the current device (opt-in shared memory, cluster size) once per context.
const KernelState& prepare_kernel(int dev, const DecodeProblem& p, const DecodeKernels& k) {
  KernelState& st = g_state[dev & 63][instance_index(p)];
  if (st.blocks_per_sm.load() > 0 && st.context.load() == cuda::current_context_id()) return st;
  FL_CUDA_CHECK(cudaFuncSetAttribute(k.split, cudaFuncAttributeMaxDynamicSharedMemorySize, k.split_smem_bytes));
  // Both kernels ask for the same L1 / shared split, so the SMs need no reconfiguration between them (the combine
  // kernel's blocks start beside the split kernel's tail as programmatic dependents).
  FL_CUDA_CHECK(cudaFuncSetAttribute(k.split, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  FL_CUDA_CHECK(cudaFuncSetAttribute(k.combine, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  int n = 0;
  FL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k.split, kSplitThreads, k.split_smem_bytes));
  // PDL and the cluster merge need an sm_90 device running code built with them (else the merge is a trap and
  // griddepcontrol.wait is compiled out).
  const cuda::DeviceProps& props = cuda::device_props(dev);
  const bool sm90 = props.cc >= 90 && cuda::kernel_has_sm90_code(k.split);
  st.sm90_code.store(sm90);
  st.cluster_splits.store(sm90 && props.clusters ? query_cluster_splits(k) : 0);
  st.context.store(cuda::current_context_id());
  st.blocks_per_sm.store(n < 1 ? 1 : n);
  return st;
}

#if FLASHLITE_DECODE_TIMELINE
unsigned long long* g_timeline = nullptr;
size_t g_timeline_slot = 0, g_timeline_calls = 0, g_timeline_slots = 2;
#endif

}  // namespace

#if FLASHLITE_DECODE_TIMELINE
void cuda_decode_set_timeline(unsigned long long* buffer, size_t slot_blocks, size_t slots) {
  g_timeline = buffer;
  g_timeline_slot = slot_blocks * cuda_decode::kTimelineStamps;
  g_timeline_calls = 0;
  g_timeline_slots = slots > 0 ? slots : 1;
}
#endif

std::string cuda_decode_unsupported_reason(const DecodeProblem& p) {
  const KvCacheDesc& c = p.cache;
  if (c.dtype != DType::bf16 && c.dtype != DType::f16) {
    return std::string("the CUDA decode kernel needs a float16 or bfloat16 cache; got ") + dtype_name(c.dtype) +
           " (float32 caches run on the cpu backend)";
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return "head_dim " + std::to_string(c.head_dim) + " is not supported by the CUDA decode kernel; expected 64 or 128";
  }
  if (p.q_len > 64) return "q_len " + std::to_string(p.q_len) + " is too long for the CUDA decode kernel; expected 1..64";
  if (!aligned16(c.k, c.ks) || !aligned16(c.v, c.vs)) {
    return "cache.k / cache.v rows are not 16-byte aligned (data pointer and the first three strides must be "
           "multiples of 16 bytes); the CUDA decode kernel copies 16-byte chunks";
  }
  if (c.batch > 65535) return "batch " + std::to_string(c.batch) + " exceeds the CUDA decode grid; expected at most 65535";
  if (c.kv_heads * row_chunks(p) > 65535) return "kv_heads x row chunks exceeds the CUDA decode grid (65535)";
  return "";
}

CudaDecodeDevice cuda_decode_device(const DecodeProblem& p) {
  const int dev = p.cache.device.index;
  cuda::DeviceGuard guard(dev);
  const cuda::DeviceProps& props = cuda::device_props(dev);
  const KernelState& st = prepare_kernel(dev, p, kernels_for(p));
  CudaDecodeDevice d;
  d.sms = props.sms;
  d.l2_bytes = props.l2_bytes;
  d.slots = int64_t(props.sms) * st.blocks_per_sm.load();
  d.cluster_splits = st.cluster_splits.load();
  d.sm90_code = st.sm90_code.load();
  return d;
}

std::string cuda_decode_kernel_name(const DecodeProblem& p, const CudaDecodeLaunch& plan) {
  std::string name = std::string("cuda_decode_split_") + (p.cache.dtype == DType::bf16 ? "bf16" : "f16") + "_d" +
                     std::to_string(p.cache.head_dim) + (p.cache.paged ? "_paged" : "_contiguous");
  name += " (splits " + std::to_string(plan.splits);
  if (plan.splits > 1) name += plan.cluster_merge ? ", cluster merge" : ", combine kernel";
  if (plan.kv_evict_first) name += ", K/V evict-first";
  return name + ")";
}

void run_cuda_decode(const DecodeProblem& p, const CudaDecodeLaunch& plan, void* stream_handle, void* workspace) {
  const KvCacheDesc& c = p.cache;
  const int dev = c.device.index;
  const int num_splits = plan.splits;
  cuda::DeviceGuard guard(dev);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const DecodeKernels kern = kernels_for(p);
  prepare_kernel(dev, p, kern);

  DecodeParams P;
  P.q = p.q;
  P.out = p.out;
  P.lse = p.lse;
  P.sink_logits = p.sink_logits;
  P.q_stride = p.q_st, P.out_stride = p.o_st, P.lse_stride = p.lse_st;
  P.k = c.k;
  P.v = c.v;
  P.k_stride = c.ks, P.v_stride = c.vs;
  cuda::set_cache_index(P, c);
  if (c.paged && (P.page_size & (P.page_size - 1)) == 0) {
    P.page_shift = 0;
    while ((1 << P.page_shift) < P.page_size) ++P.page_shift;
  }
  P.batch = int(c.batch);
  P.q_len = int(p.q_len);
  P.q_heads = int(p.q_heads);
  P.kv_heads = int(c.kv_heads);
  P.group = int(p.group());
  P.rows = int(p.group() * p.q_len);
  P.row_chunks = int(row_chunks(p));
  P.num_splits = num_splits;
  P.scale = float(p.scale);
  P.scale_log2 = float(p.scale * double(kLog2e));
  P.softcap = float(p.softcap);
  P.mask = p.mask;
  P.q_vec = aligned16(p.q, p.q_st);
#if FLASHLITE_DECODE_TIMELINE
  if (g_timeline) P.timeline = g_timeline + (g_timeline_calls++ % g_timeline_slots) * g_timeline_slot;
#endif

  // Splits merged in a cluster need no partials in global memory and no combine kernel. The plan's workspace stays
  // reserved either way (decode_workspace_bytes does not depend on the merge).
  const int cluster = plan.cluster_merge ? num_splits : 0;
  P.cluster_merge = plan.cluster_merge;
  P.kv_evict_first = plan.kv_evict_first;

  void* ws = workspace;
  const size_t need = decode_workspace_bytes(p, num_splits);
  bool owned = false;
  if (num_splits > 1 && !P.cluster_merge) {
    if (ws == nullptr) {
      FL_CUDA_CHECK(cudaMallocAsync(&ws, need, stream));
      owned = true;
    }
    const size_t rows_total = size_t(c.batch * p.q_heads * p.q_len) * size_t(num_splits);
    const size_t o_bytes = (rows_total * size_t(c.head_dim) * sizeof(float) + 255) / 256 * 256;
    P.part_o = static_cast<float*>(ws);
    P.part_lse = reinterpret_cast<float*>(static_cast<char*>(ws) + o_bytes);
  }

  // Both kernels are programmatic dependents of what precedes them in the stream (sm_90): the split kernel's blocks
  // launch while the previous kernel (e.g. the last decode's combine) drains and wait for it in griddepcontrol.wait
  // before their first read; the combine kernel likewise behind the split kernel.
  void* args[] = {&P};
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  const bool pdl = plan.pdl;
  if (pdl) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 0) {
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = unsigned(cluster), attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(num_splits), unsigned(c.kv_heads * P.row_chunks), unsigned(c.batch));
  cfg.blockDim = dim3(kSplitThreads);
  cfg.dynamicSmemBytes = size_t(kern.split_smem_bytes);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = unsigned(n_attr);
  FL_CUDA_CHECK(cudaLaunchKernelExC(&cfg, kern.split, args));
  if (num_splits > 1 && !P.cluster_merge) {
    cfg.numAttrs = pdl ? 1 : 0;  // the combine kernel: programmatic dependent, no cluster
    const int64_t items = c.batch * c.kv_heads * int64_t(P.rows);
    cfg.gridDim = dim3(unsigned((items + kCombineThreads / 32 - 1) / (kCombineThreads / 32)));
    cfg.blockDim = dim3(kCombineThreads);
    cfg.dynamicSmemBytes = 0;
    FL_CUDA_CHECK(cudaLaunchKernelExC(&cfg, kern.combine, args));
  }
  if (owned) FL_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace flashlite
