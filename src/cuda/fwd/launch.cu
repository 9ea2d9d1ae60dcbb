// Entry points of the fused CUDA forward backend (src/backends.h): what it supports, which kernel runs (decided in
// exactly one function, choose_fwd_kernel below) and the launch. Also prefill from a KV cache (src/kv/kv_prefill.h):
// the same kernel with its KV-cache loader (choose_prefill_kernel), launched by run_cuda_prefill.
//
// Host/device traffic per call: none for padded batches (parameters by value: graph-capturable, no allocation,
// no host sync). Varlen offsets of up to kInlineSeqs sequences ride inside the kernel parameters too; longer
// tables go to a per-call device buffer (cudaMallocAsync + cudaMemcpyAsync from the host array + cudaFreeAsync, all
// on the caller's stream): correct and asynchronous, but not capturable in a CUDA graph.
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends.h"
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

struct DeviceProps {
  int cc = 0;          // major * 10 + minor
  int smem_optin = 0;  // bytes of shared memory one block may opt in to
};

// Cached per device (attribute queries are cheap but not free; they never synchronise).
DeviceProps device_props(int dev) {
  static std::atomic<int> cc[64], smem[64];
  DeviceProps d;
  if (dev >= 0 && dev < 64 && cc[dev].load() != 0) return {cc[dev].load(), smem[dev].load()};
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "reading the compute capability");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "reading the compute capability");
  check(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "reading the shared-memory limit");
  d.cc = major * 10 + minor;
  if (dev >= 0 && dev < 64) {
    smem[dev].store(d.smem_optin);
    cc[dev].store(d.cc);
  }
  return d;
}

// Runs the launch on the tensors' device and puts the caller's current device back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ == dev) {
      prev_ = -1;
    } else {
      check(cudaSetDevice(dev), "cudaSetDevice");
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

bool supported_head_dim(int64_t d) { return d == 32 || d == 64 || d == 96 || d == 128 || d == 256; }

struct FwdChoice {
  bool simt = false;  // fp32 path
  MmaConfig mma{};
  int block_rows = 0;
  int smem_bytes = 0;
};

// THE kernel choice: tile shapes per (head_dim, dtype, GPU). The tensor-core configurations are those of
// FL_FWD_MMA_CONFIGS (the only ones compiled); bench/fwd's sweep is the evidence for each pick
// (docs/perf-notes.md, "Fused forward").
FwdChoice choose_fwd_kernel(const AttentionProblem& p, const DeviceProps& dev) {
  FwdChoice k;
  if (p.dtype == DType::f32) {
    k.simt = true;
    k.block_rows = simt_f32_block_rows();
    return k;
  }
  const auto fits = [&](MmaConfig c) { return mma_config_info(c).smem_bytes <= dev.smem_optin; };
  const bool masked = p.mask.causal || p.mask.window_left >= 0 || p.mask.window_right >= 0;
  switch (p.head_dim) {
    case 32: k.mma = MmaConfig::d32_br128_bc128_w4_s2_qreg; break;
    case 64:  // masked rows waste less of a 64-key tile; full rows run best with FA2's 128 x 128 tile
      k.mma = masked ? MmaConfig::d64_br128_bc64_w4_s2_qreg : MmaConfig::d64_br128_bc128_w4_s2;
      break;
    case 96: k.mma = MmaConfig::d96_br128_bc64_w4_s2; break;
    case 128:  // 104 KB: A100/H100 class; 99 KB parts (sm_86/89) take the register-Q tile
      k.mma = fits(MmaConfig::d128_br128_bc64_w4_s2_f3) ? MmaConfig::d128_br128_bc64_w4_s2_f3
                                                      : MmaConfig::d128_br64_bc64_w4_s2_qreg;
      break;
    default:  // 256: 203 KB on H100; elsewhere the small tile
      k.mma = dev.cc >= 90 && fits(MmaConfig::d256_br128_bc64_w8_s2) ? MmaConfig::d256_br128_bc64_w8_s2
                                                                     : MmaConfig::d256_br32_bc32_w2_s2;
      break;
  }
  k.block_rows = mma_config_info(k.mma).block_rows;
  k.smem_bytes = mma_config_info(k.mma).smem_bytes;
  return k;
}

bool rows_aligned16(const void* base, const BSHStrides& s, int64_t batch, int64_t heads) {
  const auto ok = [](int64_t stride) { return (stride * 2) % 16 == 0; };  // 2-byte elements
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && ok(s.seq) && (batch <= 1 || ok(s.batch)) &&
         (heads <= 1 || ok(s.head));
}

std::string dtype_tag(DType t) { return t == DType::f16 ? "f16" : t == DType::bf16 ? "bf16" : "f32"; }

// THE kernel choice of prefill from a KV cache: the forward's causal tile per head_dim, among FL_FWD_CACHE_CONFIGS
// (the only configurations with a cache variant). False for a head_dim without one.
bool choose_prefill_kernel(int64_t head_dim, const DeviceProps& dev, MmaConfig& c) {
  switch (head_dim) {
    case 64: c = MmaConfig::d64_br128_bc64_w4_s2_qreg; return true;
    case 128:  // 104 KB: A100/H100 class; 99 KB parts (sm_86/89) take the register-Q tile
      c = mma_config_info(MmaConfig::d128_br128_bc64_w4_s2_f3).smem_bytes <= dev.smem_optin
              ? MmaConfig::d128_br128_bc64_w4_s2_f3
              : MmaConfig::d128_br64_bc64_w4_s2_qreg;
      return true;
    default: return false;
  }
}

// Hopper kernel (src/cuda/fwd_hopper/): on sm_90, in a build with the 90a target, for a problem it accepts, unless
// FLASHLITE_FWD_HOPPER=0; everything else takes choose_fwd_kernel's kernel.
// Causal block order: rank-major within groups of this many (sequence, head) pairs (block_order.h). The Hopper kernel
// takes 8 on causal masks without a window (H100: +7% at D64 S1024 and up to +47% at D128 S2048 over one group, the
// group's K/V hit in L2; 32 was slightly slower); the mma.sync kernel keeps one group (its measured best against
// pair-major).
// FLASHLITE_FWD_RANK_GROUP=N (read once) overrides both; 0 = one group.
constexpr int kHopperRankGroup = 8;
int rank_group_pairs(bool hopper) {
  static const int from_env = [] {
    const char* e = std::getenv("FLASHLITE_FWD_RANK_GROUP");
    if (e == nullptr || *e == '\0') return -1;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end != '\0' || v < 0 || v > INT_MAX) {
      throw Error(ErrorKind::invalid_value, std::string("FLASHLITE_FWD_RANK_GROUP=") + e +
                                                ": expected a number of (sequence, head) pairs >= 0 (0 = one group)");
    }
    return int(v);
  }();
  return from_env >= 0 ? from_env : hopper ? kHopperRankGroup : 0;
}

bool use_hopper(const AttentionProblem& p, const DeviceProps& dev) {
  namespace h = cuda_fwd_hopper;
  return h::hopper_fwd_built() && h::hopper_fwd_enabled() && dev.cc == 90 &&
         h::hopper_fwd_reject_reason(p, dev.cc).empty();
}

}  // namespace

FwdParams make_fwd_params(const AttentionProblem& p, int block_rows, bool tensor_cores) {
  FwdParams f;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.out = p.out;
  f.lse = p.lse;
  f.sink_logits = p.sink_logits;
  f.q_sb = p.q_stride.batch, f.q_ss = p.q_stride.seq, f.q_sh = p.q_stride.head;
  f.k_sb = p.k_stride.batch, f.k_ss = p.k_stride.seq, f.k_sh = p.k_stride.head;
  f.v_sb = p.v_stride.batch, f.v_ss = p.v_stride.seq, f.v_sh = p.v_stride.head;
  f.o_sb = p.out_stride.batch, f.o_ss = p.out_stride.seq, f.o_sh = p.out_stride.head;
  f.lse_sb = p.lse_stride_batch, f.lse_sh = p.lse_stride_head, f.lse_ss = p.lse_stride_seq;
  f.batch = int(p.batch);
  f.seq_q = int(p.seq_q);
  f.seq_k = int(p.seq_k);
  f.q_heads = int(p.q_heads);
  f.group = int(p.group_size());
  f.q_tiles = int((p.seq_q + block_rows - 1) / block_rows);
  const double log2e = 1.4426950408889634;
  f.scale_log2 = float(p.scale * log2e);
  f.softcap = p.softcap > 0;
  if (f.softcap) {
    f.softcap_pre = float(p.scale / p.softcap);
    f.softcap_post = float(p.softcap * log2e);
  }
  // Causal: heaviest query tiles first (tile rank slowest; mma.sync: over the whole grid, measured 3-10% faster than
  // keeping a head's tiles together); otherwise a head's tiles run side by side (K/V shared in L2).
  f.reverse_tiles = p.mask.causal;
  f.rank_major = p.mask.causal;
  f.rank_group = rank_group_pairs(false);
  f.mask = p.mask;
  const int64_t tb = p.varlen() ? 1 : p.batch;
  if (tensor_cores) {
    f.vec_in = rows_aligned16(p.q, p.q_stride, tb, p.q_heads) && rows_aligned16(p.k, p.k_stride, tb, p.kv_heads) &&
               rows_aligned16(p.v, p.v_stride, tb, p.kv_heads);
    f.vec_out = rows_aligned16(p.out, p.out_stride, tb, p.q_heads);
  }
  return f;
}

}  // namespace cuda_fwd

std::string cuda_fused_unsupported_reason(const AttentionProblem& p) {
  using namespace cuda_fwd;
  if (!supported_head_dim(p.head_dim)) {
    return "head_dim " + std::to_string(p.head_dim) +
           " is unsupported by the fused CUDA kernel (backend 'cuda'); expected one of 32, 64, 96, 128, 256";
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return "backend 'cuda': no CUDA device is available";
  }
  if (p.device.index < 0 || p.device.index >= count) {
    return "the tensors are on " + device_name(p.device) + " but only " + std::to_string(count) +
           " CUDA device(s) exist";
  }
  const DeviceProps dev = device_props(p.device.index);
  if (dev.cc < 80) {
    return "the fused CUDA kernel needs compute capability 8.0 or newer (mma.sync bf16, cp.async); " +
           device_name(p.device) + " has " + std::to_string(dev.cc / 10) + "." + std::to_string(dev.cc % 10);
  }
  const FwdChoice k = choose_fwd_kernel(p, dev);
  if (k.smem_bytes > dev.smem_optin) {
    return "head_dim " + std::to_string(p.head_dim) + " needs " + std::to_string(k.smem_bytes) +
           " bytes of shared memory per block but " + device_name(p.device) + " allows " +
           std::to_string(dev.smem_optin);
  }
  if (p.seq_q > INT_MAX || p.seq_k > INT_MAX || p.q_tensor_rows > INT_MAX) {
    return "sequence length " + std::to_string(std::max(p.seq_q, p.seq_k)) +
           " is too long for the fused CUDA kernel; expected at most " + std::to_string(INT_MAX);
  }
  const int64_t tiles = (p.seq_q + k.block_rows - 1) / k.block_rows;
  if (tiles * p.q_heads * p.batch > INT_MAX) {
    return "batch " + std::to_string(p.batch) + " x q_heads " + std::to_string(p.q_heads) + " x query tiles " +
           std::to_string(tiles) + " exceeds the fused CUDA kernel's grid limit of " + std::to_string(INT_MAX) +
           " blocks";
  }
  return {};
}

std::string cuda_fused_kernel_name(const AttentionProblem& p) {
  using namespace cuda_fwd;
  const DeviceProps dev = device_props(p.device.index);
  if (use_hopper(p, dev)) return cuda_fwd_hopper::hopper_fwd_kernel_name(p, cuda_fwd_hopper::hopper_fwd_mode());
  const FwdChoice k = choose_fwd_kernel(p, dev);
  if (k.simt) return "cuda_fused_simt_f32_d" + std::to_string(p.head_dim);
  return "cuda_fused_mma_" + dtype_tag(p.dtype) + "_" + mma_config_info(k.mma).name;
}

void run_cuda_fused(const AttentionProblem& p, void* stream_handle) {
  using namespace cuda_fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceGuard guard(p.device.index);
  const DeviceProps dev = device_props(p.device.index);
  const bool hopper = use_hopper(p, dev);
  const FwdChoice k = choose_fwd_kernel(p, dev);
  FwdParams f = make_fwd_params(p, hopper ? cuda_fwd_hopper::kBlockRows : k.block_rows, !k.simt);
  // Groups of 8 were measured on causal masks without a window; windows keep the order their Flex numbers were taken
  // with (one group) until measured.
  f.rank_group = rank_group_pairs(hopper && p.mask.window_left < 0);

  cuda::CallBuffer table(stream);  // varlen offsets past kInlineSeqs
  if (p.varlen()) {
    if (p.batch <= kInlineSeqs) {
      f.varlen = VarlenMode::inline_table;
      for (int64_t b = 0; b <= p.batch; ++b) {
        f.cu_inline[0][b] = p.cu_seqlens_q[b];
        f.cu_inline[1][b] = p.cu_seqlens_k[b];
      }
    } else {
      f.varlen = VarlenMode::device_table;
      std::vector<int> host(size_t(2 * (p.batch + 1)));  // (2, batch + 1)
      for (int64_t b = 0; b <= p.batch; ++b) {
        host[size_t(b)] = p.cu_seqlens_q[b];
        host[size_t(p.batch + 1 + b)] = p.cu_seqlens_k[b];
      }
      const size_t bytes = host.size() * sizeof(int);
      cuda::refuse_host_copy_under_capture(stream, "the varlen offsets of " + std::to_string(p.batch) + " sequences");
      check(cudaMallocAsync(&table.ptr, bytes, stream), "cudaMallocAsync (varlen offsets)");
      // From pageable memory: returns once the bytes are staged, so `host` may go out of scope.
      check(cudaMemcpyAsync(table.ptr, host.data(), bytes, cudaMemcpyHostToDevice, stream), "copying varlen offsets");
      f.cu_dev = static_cast<const int*>(table.ptr);
    }
  }

  if (hopper) {
#if defined(FLASHLITE_FWD_HOPPER_BUILT) && FLASHLITE_FWD_HOPPER_BUILT
    cuda_fwd_hopper::launch_fwd_hopper(p, f, cuda_fwd_hopper::hopper_fwd_mode(), stream);  // (a throw frees table)
#endif
  } else if (k.simt) {
    launch_fwd_simt_f32(int(p.head_dim), f, stream);
  } else if (p.dtype == DType::f16) {
    launch_fwd_mma_f16(k.mma, f, stream);
  } else {
    launch_fwd_mma_bf16(k.mma, f, stream);
  }
  const cudaError_t launched = cudaGetLastError();
  check(table.free_now(), "cudaFreeAsync (varlen offsets)");
  check(launched, "launching the fused attention kernel");
}

std::string cuda_prefill_unsupported_reason(const PrefillProblem& p) {
  using namespace cuda_fwd;
  if (p.cache.dtype == DType::f32) {
    return "float32 caches are not supported by the fused CUDA kernel; expected float16 or bfloat16 (or a CPU cache)";
  }
  MmaConfig c{};
  if (!choose_prefill_kernel(p.cache.head_dim, DeviceProps{}, c)) {
    return "head_dim " + std::to_string(p.cache.head_dim) +
           " has no KV-cache variant of the fused CUDA kernel; expected 64 or 128";
  }
  if (p.cache.paged) {  // the paged loader multiplies page ids and slots by 32-bit strides
    for (int64_t st : {p.cache.ks.s0, p.cache.ks.s1, p.cache.vs.s0, p.cache.vs.s1}) {
      if (st < INT_MIN || st > INT_MAX) {
        return "a paged cache stride of " + std::to_string(st) + " elements is too large for the fused CUDA kernel; "
               "expected page and token strides within 32 bits";
      }
    }
  }
  // Device, compute capability, shared memory, lengths and grid as forward() checks them.
  return cuda_fused_unsupported_reason(p.attn);
}

std::string cuda_prefill_kernel_name(const PrefillProblem& p) {
  using namespace cuda_fwd;
  MmaConfig c{};
  choose_prefill_kernel(p.cache.head_dim, device_props(p.cache.device.index), c);
  return std::string("cuda_prefill_") + (p.cache.paged ? "paged_" : "contiguous_") + dtype_tag(p.cache.dtype) + "_" +
         mma_config_info(c).name;
}

void run_cuda_prefill(const PrefillProblem& p, void* stream_handle) {
  using namespace cuda_fwd;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const KvCacheDesc& c = p.cache;
  const AttentionProblem& a = p.attn;
  DeviceGuard guard(c.device.index);
  MmaConfig cfg{};
  choose_prefill_kernel(c.head_dim, device_props(c.device.index), cfg);
  FwdParams f = make_fwd_params(a, mma_config_info(cfg).block_rows, true);
  const int64_t kv_rows = c.paged ? c.num_pages : c.batch;  // what the K/V batch stride steps over
  f.vec_in = rows_aligned16(a.q, a.q_stride, p.ragged() ? 1 : a.batch, a.q_heads) &&
             rows_aligned16(a.k, a.k_stride, kv_rows, c.kv_heads) && rows_aligned16(a.v, a.v_stride, kv_rows, c.kv_heads);
  f.kv_paged = c.paged;
  f.page_size = c.paged ? int(c.capacity) : 0;
  f.kv_seq_lens = c.k_seq_lens;
  f.kv_page_indptr = c.k_indptr;
  f.kv_page_indices = c.k_indices;
  f.kv_last_page_len = c.k_last_page_len;

  cuda::CallBuffer table(stream);  // ragged offsets past kInlineSeqs
  if (p.ragged()) {
    if (a.batch <= kInlineSeqs) {
      f.varlen = VarlenMode::inline_table;
      for (int64_t b = 0; b <= a.batch; ++b) f.cu_inline[0][b] = a.cu_seqlens_q[b];
    } else {
      f.varlen = VarlenMode::device_table;
      const size_t bytes = size_t(a.batch + 1) * sizeof(int);
      cuda::refuse_host_copy_under_capture(stream, "the prefill chunk offsets of " + std::to_string(a.batch) + " sequences");
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
  check(launched, "launching the fused attention kernel (prefill)");
}

}  // namespace flashlite
