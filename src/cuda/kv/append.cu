// CUDA append of one step's (or a prefill chunk's) K/V into the cache, all sequences in one launch, with the rotary
// embedding of K (and Q) fused in. Blocks per new token (append_kernel): each computes the token's cos/sin table once
// (float64 angles from the host's inv_freq table, so long positions stay exact), then writes its share of every kv
// head's K (rotated) and V row and of the rotated q heads, all through flashlite/cuda/rope.cuh (the RoPE of the whole
// repository). Positions come from the device index (graph-safe): the token t of n new ones of sequence b sits at
// length(b) - n + t.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "common/paged.h"
#include "cuda/common/check.h"
#include "cuda/common/dtype.cuh"
#include "cuda/common/host_copy.h"
#include "cuda/common/kernel_arch.h"
#include "cuda/common/pdl.cuh"
#include "flashlite/cuda/rope.cuh"
#include "kv/kv_backends.h"

namespace flashlite {
namespace cuda_kv {

inline constexpr int kAppendThreads = 128;
inline constexpr int kMaxPairs = 128;  // head_dim <= 256

struct AppendParams {
  const void* k_new = nullptr;  // (batch, n, kv_heads, head_dim)
  const void* v_new = nullptr;
  RowStrides k_new_stride, v_new_stride;
  const void* q = nullptr;  // optional (batch, n, q_heads, head_dim)
  void* q_out = nullptr;
  RowStrides q_stride, q_out_stride;
  int q_heads = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  RowStrides k_cache_stride, v_cache_stride;  // batch: a sequence (contiguous) or a page (paged)
  bool paged = false;
  int page_size = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
  int n_new = 0, kv_heads = 0, head_dim = 0;
  bool rope = false;
  bool interleaved = false;
  double inv_freq[kMaxPairs];
};

// One token per blockIdx.x; its work items, [K: kv_heads * half rotated pairs (kv_heads * head_dim copies without
// RoPE) | V: kv_heads * head_dim copies | q: q_heads * half rotated pairs], spread over gridDim.y blocks (item
// y * threads + thread, stepping by gridDim.y * threads), so that a decode step of a few tokens still fills the GPU.
// A programmatic dependent on sm_90: it waits for the kernel before it (which wrote the new K / V / q and the index)
// before its first read.
template <class T>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ AppendParams p) {
  cuda::pdl_launch_dependents();
  cuda::pdl_wait();
  __shared__ float2 cs[kMaxPairs];  // (cos, sin) of this token's angles
  const int b = int(blockIdx.x) / p.n_new, t = int(blockIdx.x) % p.n_new;
  const int half = p.head_dim / 2;
  int L, page_base = 0;
  if (p.paged) {
    page_base = p.indptr[b];
    const int pages = p.indptr[b + 1] - page_base;
    L = paged_length<int>(pages, p.page_size, p.last_page_len, b);
  } else {
    L = p.seq_lens[b];
  }
  const int pos = L - p.n_new + t;
  if (p.rope) {
    for (int c = int(threadIdx.x); c < half; c += kAppendThreads) cs[c] = cuda::rope_cos_sin(pos, p.inv_freq[c]);
    __syncthreads();
  }
  int64_t page = b, slot = pos;
  if (p.paged) {
    page = p.indices[page_base + pos / p.page_size];
    slot = pos % p.page_size;
  }
  T* kc = static_cast<T*>(p.k_cache) + page * p.k_cache_stride.batch + slot * p.k_cache_stride.seq;
  T* vc = static_cast<T*>(p.v_cache) + page * p.v_cache_stride.batch + slot * p.v_cache_stride.seq;
  const T* kn = static_cast<const T*>(p.k_new) + b * p.k_new_stride.batch + t * p.k_new_stride.seq;
  const T* vn = static_cast<const T*>(p.v_new) + b * p.v_new_stride.batch + t * p.v_new_stride.seq;

  const int k_items = p.rope ? p.kv_heads * half : p.kv_heads * p.head_dim, v_items = p.kv_heads * p.head_dim;
  const int items = k_items + v_items + (p.q != nullptr ? p.q_heads * half : 0);
  for (int it = int(blockIdx.y * kAppendThreads + threadIdx.x); it < items; it += int(gridDim.y) * kAppendThreads) {
    if (it < k_items && p.rope) {  // K: a rotated pair
      const int h = it / half, c = it % half;
      const RopePairIndex i = rope_pair(c, p.head_dim, p.interleaved);
      const float xa = cuda::to_float(kn[h * p.k_new_stride.head + i.a]);
      const float xb = cuda::to_float(kn[h * p.k_new_stride.head + i.b]);
      kc[h * p.k_cache_stride.head + i.a] = cuda::from_float<T>(cuda::rope_rotate_element(xa, xb, cs[c], false));
      kc[h * p.k_cache_stride.head + i.b] = cuda::from_float<T>(cuda::rope_rotate_element(xa, xb, cs[c], true));
    } else if (it < k_items) {  // K: a copy
      const int h = it / p.head_dim, e = it % p.head_dim;
      kc[h * p.k_cache_stride.head + e] = kn[h * p.k_new_stride.head + e];
    } else if (it < k_items + v_items) {  // V: a copy
      const int h = (it - k_items) / p.head_dim, e = (it - k_items) % p.head_dim;
      vc[h * p.v_cache_stride.head + e] = vn[h * p.v_new_stride.head + e];
    } else {  // q: a rotated pair, in place allowed (both read before either write)
      const int h = (it - k_items - v_items) / half, c = (it - k_items - v_items) % half;
      const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + t * p.q_stride.seq;
      T* qo = static_cast<T*>(p.q_out) + b * p.q_out_stride.batch + t * p.q_out_stride.seq;
      const RopePairIndex i = rope_pair(c, p.head_dim, p.interleaved);
      const float xa = cuda::to_float(q[h * p.q_stride.head + i.a]), xb = cuda::to_float(q[h * p.q_stride.head + i.b]);
      qo[h * p.q_out_stride.head + i.a] = cuda::from_float<T>(cuda::rope_rotate_element(xa, xb, cs[c], false));
      qo[h * p.q_out_stride.head + i.b] = cuda::from_float<T>(cuda::rope_rotate_element(xa, xb, cs[c], true));
    }
  }
}

}  // namespace cuda_kv

std::string cuda_append_unsupported_reason(const AppendProblem& p) {
  if (p.cache.head_dim > 2 * cuda_kv::kMaxPairs) {
    return "head_dim " + std::to_string(p.cache.head_dim) + " is too large for the CUDA append kernel; expected at most " +
           std::to_string(2 * cuda_kv::kMaxPairs);
  }
  if (p.cache.batch * p.n_new > int64_t(INT32_MAX)) return "batch x new tokens exceeds the CUDA append grid";
  return "";
}

void run_cuda_append(const AppendProblem& p, void* stream) {
  const KvCacheDesc& c = p.cache;
  cuda::DeviceGuard guard(c.device.index);
  cuda_kv::AppendParams P;
  P.k_new = p.k;
  P.v_new = p.v;
  P.k_new_stride = p.k_st, P.v_new_stride = p.v_st;
  P.q = p.q;
  P.q_out = p.q_out;
  P.q_stride = p.q_st, P.q_out_stride = p.qo_st;
  P.q_heads = int(p.q_heads);
  P.k_cache = c.k;
  P.v_cache = c.v;
  P.k_cache_stride = c.ks, P.v_cache_stride = c.vs;
  cuda::set_cache_index(P, c);
  P.n_new = int(p.n_new);
  P.kv_heads = int(c.kv_heads);
  P.head_dim = int(c.head_dim);
  P.rope = p.rope.enabled;
  P.interleaved = p.rope.interleaved;
  for (int64_t i = 0; i < c.head_dim / 2 && p.rope.enabled; ++i) P.inv_freq[i] = rope_frequency(p.rope.options, c.head_dim, i);
  // Blocks per token: enough for one item per thread, while the grid holds fewer than ~2048 blocks (a prefill chunk of
  // many tokens keeps one block per token).
  const int64_t tokens = c.batch * p.n_new, half = c.head_dim / 2;
  const int64_t items = (P.rope ? c.kv_heads * half : c.kv_heads * c.head_dim) + c.kv_heads * c.head_dim +
                        (p.q ? p.q_heads * half : 0);
  const int64_t per_token = std::clamp<int64_t>(std::min((items + cuda_kv::kAppendThreads - 1) / cuda_kv::kAppendThreads,
                                                         2048 / std::max<int64_t>(tokens, 1)), 1, 65535);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(tokens), unsigned(per_token));
  cfg.blockDim = dim3(cuda_kv::kAppendThreads);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cuda::dispatch_float_dtype(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    // A programmatic dependent where its code has griddepcontrol.wait (sm_90 code: cuda/common/kernel_arch.h).
    cfg.numAttrs = cuda::kernel_has_sm90_code(reinterpret_cast<const void*>(&cuda_kv::append_kernel<T>)) ? 1 : 0;
    FL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, cuda_kv::append_kernel<T>, P));
  });
}

}  // namespace flashlite
