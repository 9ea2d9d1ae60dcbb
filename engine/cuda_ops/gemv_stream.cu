// The streamed-weights GEMV (gemv.h, GemvParams::stream; opt-in, FLASHLITE_ENGINE_STREAM): one activation row, the
// weights brought into a ring of 8 KB shared-memory slots by the bulk-copy engine (cp.async.bulk, sm_90) instead of
// registers. Why: the register GEMV fills the register file with its in-flight loads, so the next kernel's blocks
// cannot be resident before this one's retire, and every GEMV starts its weight stream cold after
// griddepcontrol.wait. Here a block holds 256 + 32 threads and its ring, and its producer issues the first ring's
// worth of weights (which no predecessor writes) before the wait.
// Status (docs/perf-notes.md, "Engine round 7"): correct in every test, but slower than the register kernel on the
// H100 (steady state ~2.0 TB/s against 2.4-2.65 at the big shapes; engine 600-750 tok/s against 860), so not the
// default; smaller slots were slower still, which points at a per-stage cost, not at the bytes in flight.
//
// Work comes in units of a few weight rows (~16 KB): a ring's worth per block by block index (issued before the
// wait), the rest claimed from a counter (GemvParams::counters) after the wait, so blocks that share an SM or start
// late balance out; the last block to finish zeroes the counter for the next launch. A unit is one or two row ranges
// whose sums its epilogue combines: plain rows, a SwiGLU gate range and its up range, or the RoPE pairs of one head
// (half-split: rows p.. and p + D/2..; interleaved: 2n adjacent rows). Each range is cut into slot-sized stages.
// Consumer warp w takes the block's stages w, w + 8, ... (slot s is always read by warp s % 8, so the ring is a
// multiple of 8 slots); its row sums go to the unit's part buffer, one entry per (row, stage), and the warp that
// completes the unit's last stage adds them in stage order (deterministic) and runs the epilogue.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/cuda_ops/bf16_dot.cuh"
#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/pdl.cuh"
#include "engine/errors.h"
#include "src/cuda/common/mbarrier.cuh"

namespace flashlite::engine::cuda_ops {

namespace {

constexpr int kConsumerWarps = 8, kConsumers = kConsumerWarps * 32, kThreads = kConsumers + 32;
constexpr int kSlotBytes = 8192;
constexpr int kMaxRangeRows = 16;  // rows of one range of a unit

enum class Layout : int { plain, pair, rope_half, rope_interleaved };

// How the weight rows split into units (host-computed, passed by value).
struct StreamPlan {
  Layout layout = Layout::plain;
  int n = 1;          // rows per range (interleaved RoPE: pairs, 2n rows)
  int ranges = 1;     // 1 or 2
  int units = 0;
  int per_head = 1;   // RoPE: units per head
  int stages = 16;    // ring slots
  int static_units = 4;  // units per block assigned by block index (issued before the wait)
  int x_bytes = 0;    // staged activation row
};

struct Meta {
  int unit, range, f0, count;  // count 0: no more work for the warp that reads it
  int unit_stages;             // stages of the unit (both ranges)
  int q;                       // the unit's index among the block's units (its part buffer: q % buffers)
  int piece;                   // the stage's index within its range
  int pad;                     // 32 bytes
};

constexpr int kMaxPieces = 8;  // stages per range (ranges of up to 64 KB)
struct PartBuffer {
  float v[2 * kMaxRangeRows][kMaxPieces];
};

struct RangeRows {
  int row0, count;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kSlotChunks = kSlotBytes / 16, kConsumerBarrier = 1;

__device__ __forceinline__ RangeRows range_rows(const GemvParams& p, const StreamPlan& sp, int u, int range) {
  switch (sp.layout) {
    case Layout::plain:
    case Layout::pair: {
      const int r0 = u * sp.n, cnt = min(sp.n, p.out - r0);
      return {range == 0 ? r0 : p.out + r0, cnt};
    }
    case Layout::rope_half: {
      const int D = p.rope.head_dim, h = u / sp.per_head, p0 = (u % sp.per_head) * sp.n;
      return {h * D + p0 + (range ? D / 2 : 0), sp.n};
    }
    default: {  // rope_interleaved
      const int D = p.rope.head_dim, h = u / sp.per_head, p0 = (u % sp.per_head) * sp.n;
      return {h * D + 2 * p0, 2 * sp.n};
    }
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
using ::flashlite::cuda::mbar_arrive;  // src/cuda/common/mbarrier.cuh
using ::flashlite::cuda::mbar_arrive_expect_tx;
using ::flashlite::cuda::mbar_init;
using ::flashlite::cuda::mbar_wait;
// `bytes` (a multiple of 16) from global `src` to shared `dst`, completing on `bar`; the lines marked evict-first in
// L2 (weights are read once per step).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"r"(kConsumerBarrier), "r"(kConsumers) : "memory");
}


// The unit's outputs from its row sums (sum(r): range-0 row r; sum(n + r): range-1 row r), thread t of the consumers.
template <GemvOut OUT, class Sum>
__device__ __forceinline__ void epilogue(const GemvParams& p, const StreamPlan& sp, int u, int t, Sum sum) {
  if constexpr (OUT == GemvOut::bf16 || OUT == GemvOut::add_f32) {
    const RangeRows rr = range_rows(p, sp, u, 0);
    if (t < rr.count) {
      if constexpr (OUT == GemvOut::bf16) static_cast<__nv_bfloat16*>(p.y)[rr.row0 + t] = __float2bfloat16(sum(t));
      else static_cast<float*>(p.y)[rr.row0 + t] += sum(t);
    }
  } else if constexpr (OUT == GemvOut::swiglu_bf16) {
    const RangeRows rr = range_rows(p, sp, u, 0);
    if (t < rr.count) {
      const float g = sum(t), up = sum(sp.n + t);
      static_cast<__nv_bfloat16*>(p.y)[rr.row0 + t] = __float2bfloat16(g / (1.f + __expf(-g)) * up);
    }
  } else {  // rope_bf16: pair t of the unit; values rounded to bf16 as the unfused path stores them, then rotated
    if (t >= sp.n) return;
    const GemvRope& rp = p.rope;
    const int D = rp.head_dim, half = D / 2, h = u / sp.per_head, pair = (u % sp.per_head) * sp.n + t;
    const bool inter = sp.layout == Layout::rope_interleaved;
    const float a = __bfloat162float(__float2bfloat16(inter ? sum(2 * t) : sum(t)));
    const float b = __bfloat162float(__float2bfloat16(inter ? sum(2 * t + 1) : sum(sp.n + t)));
    const int d0 = inter ? 2 * pair : pair, d1 = inter ? 2 * pair + 1 : pair + half;
    const int kvd = rp.kv_heads * D;
    if (h >= rp.heads + rp.kv_heads) {  // v: copied as is
      __nv_bfloat16* v = static_cast<__nv_bfloat16*>(rp.v_cache) + size_t(rp.cache_row[0]) * kvd + (h - rp.heads - rp.kv_heads) * D;
      v[d0] = __float2bfloat16(a);
      v[d1] = __float2bfloat16(b);
      return;
    }
    const float c = rp.cos[size_t(rp.pos[0]) * half + pair], s = rp.sin[size_t(rp.pos[0]) * half + pair];
    const __nv_bfloat16 y0 = __float2bfloat16(a * c - b * s), y1 = __float2bfloat16(a * s + b * c);
    __nv_bfloat16* dst = h < rp.heads ? static_cast<__nv_bfloat16*>(p.y) + h * D
                                      : static_cast<__nv_bfloat16*>(rp.k_cache) + size_t(rp.cache_row[0]) * kvd + (h - rp.heads) * D;
    dst[d0] = y0;
    dst[d1] = y1;
  }
}

#endif

template <GemvOut OUT>
__global__ void __launch_bounds__(kThreads, 2) gemv_stream_kernel(const GemvParams p, const StreamPlan sp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  // Layout (stream_smem): ring slots | staged activation row (bf16) | part[buffers] | meta[stages] |
  // owner[buffers], done[buffers] | full[stages], empty[stages] barriers.
  const int nbuf = sp.stages + kConsumerWarps;
  uint4* ring = reinterpret_cast<uint4*>(smem);
  uint4* xs = reinterpret_cast<uint4*>(smem + size_t(sp.stages) * kSlotBytes);
  PartBuffer* part = reinterpret_cast<PartBuffer*>(smem + size_t(sp.stages) * kSlotBytes + sp.x_bytes);
  Meta* meta = reinterpret_cast<Meta*>(part + nbuf);
  int* owner = reinterpret_cast<int*>(meta + sp.stages);
  int* done = owner + nbuf;
  uint64_t* bars = reinterpret_cast<uint64_t*>(done + nbuf);  // 2 nbuf ints: 8-byte aligned
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kc = p.k >> 3;
  auto full = [&](int s) { return smem_addr(bars + s); };
  auto empty = [&](int s) { return smem_addr(bars + sp.stages + s); };

  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < sp.stages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 1);  // the one consumer warp of the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int i = threadIdx.x; i < nbuf * int(sizeof(PartBuffer) / 4); i += kThreads) reinterpret_cast<float*>(part)[i] = 0.f;
  for (int b = threadIdx.x; b < nbuf; b += kThreads) {
    owner[b] = b;  // buffer b first serves the block's unit b, then b + nbuf, ...
    done[b] = 0;
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // producer: streams the units' stages (weights need no wait)
    if (lane == 0) {
      const uint64_t policy = evict_first_policy();
      const uint4* W = static_cast<const uint4*>(p.w);
      int i = 0, q = 0;  // stages and units issued by this block
      auto next_slot = [&]() {
        const int s = i % sp.stages;
        mbar_wait(empty(s), ((i / sp.stages) & 1) ^ 1);
        ++i;
        return s;
      };
      auto issue = [&](int u) {
        int stages = 0;
        for (int range = 0; range < sp.ranges; ++range) stages += (range_rows(p, sp, u, range).count * kc + kSlotChunks - 1) / kSlotChunks;
        for (int range = 0; range < sp.ranges; ++range) {
          const RangeRows rr = range_rows(p, sp, u, range);
          const int total = rr.count * kc;
          for (int f0 = 0, piece = 0; f0 < total; f0 += kSlotChunks, ++piece) {
            const int s = next_slot();
            const int count = min(kSlotChunks, total - f0);
            meta[s] = {u, range, f0, count, stages, q, piece, 0};
            mbar_arrive_expect_tx(full(s), uint32_t(count) * 16u);
            bulk_load(smem_addr(ring + size_t(s) * kSlotChunks), W + size_t(rr.row0) * kc + f0, uint32_t(count) * 16u,
                      full(s), policy);
          }
        }
        ++q;
      };
      // Static units first (blockIdx.x + f * gridDim.x, about a ring's worth), issued before the wait: the weight
      // stream starts while the previous kernel runs. Then the rest from the counter, only after the wait: the
      // previous launch on these counters (possibly the kernel just before) has finished and zeroed them.
      for (int f = 0; f < sp.static_units; ++f) {
        const int u = blockIdx.x + f * gridDim.x;
        if (u >= sp.units) break;
        issue(u);
      }
      pdl_wait();
      const unsigned base = unsigned(sp.static_units) * gridDim.x;
      unsigned u = base + atomicAdd(p.counters, 1u);
      while (u < unsigned(sp.units)) {
        const unsigned nu = base + atomicAdd(p.counters, 1u);  // one claim ahead: its latency hides behind this unit
        issue(int(u));
        u = nu;
      }
      for (int w = 0; w < kConsumerWarps; ++w) {  // an end mark for each consumer warp
        const int s = next_slot();
        meta[s].count = 0;
        mbar_arrive(full(s));
      }
      // Every claim of this block is done; the last block to get here leaves the counter at zero for the next launch.
      __threadfence();
      if (atomicAdd(p.counters + 1, 1u) == gridDim.x - 1) {
        atomicExch(p.counters, 0u);
        atomicExch(p.counters + 1, 0u);
      }
    }
    return;
  }

  // Consumers: the activation row (the previous kernel's output) after the wait.
  pdl_wait();
  if constexpr (OUT == GemvOut::add_f32) {
    const uint4* x = static_cast<const uint4*>(p.x);
    for (int c = threadIdx.x; c < kc; c += kConsumers) xs[c] = x[c];
  } else {  // RMSNorm of the fp32 stream row (row_index[0] or 0), times the norm weight, rounded to bf16
    __shared__ float red[kConsumerWarps];
    const float* xr = p.xf + size_t(p.row_index ? p.row_index[0] : 0) * p.k;
    float ss = 0.f;
    for (int i = threadIdx.x; i < p.k / 4; i += kConsumers) {
      const float4 v = reinterpret_cast<const float4*>(xr)[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    consumers_sync();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) tot += red[w];
    const float inv = rsqrtf(tot / p.k + p.eps);
    __nv_bfloat16* st = reinterpret_cast<__nv_bfloat16*>(xs);
    const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(p.norm_w);
    for (int i = threadIdx.x; i < p.k; i += kConsumers) st[i] = __float2bfloat16(xr[i] * inv * __bfloat162float(g[i]));
  }
  consumers_sync();

  // Warp w takes the block's stages w, w + 8, ...: a whole slot (up to 16 chunks per lane, loads independent), so
  // the warps work on 8 stages at once. Row sums go to part[unit buffer][row][piece] (piece: the stage's index
  // within its range; each (row, piece) written once); the warp that completes a unit's last stage adds the pieces in
  // order (deterministic) and runs the epilogue.
  for (int i = warp;; i += kConsumerWarps) {
    const int s = i % sp.stages;
    mbar_wait(full(s), (i / sp.stages) & 1);
    const Meta m = meta[s];
    if (m.count == 0) {
      if (lane == 0) mbar_arrive(empty(s));
      break;
    }
    const int b = m.q % nbuf;
    if (lane == 0) {  // the buffer's previous unit (q - nbuf) has finished its epilogue
      while (*reinterpret_cast<volatile int*>(owner + b) != m.q) {
      }
      __threadfence_block();
    }
    __syncwarp();
    const uint4* ws = ring + size_t(s) * kSlotChunks;
    // 32 consecutive chunks (one lane each) lie in one row: kc and f0 are multiples of 32. c0: the warp's column.
    int row = m.f0 / kc, c0 = m.f0 - row * kc;
    const int nj = m.count >> 5;
    float acc = 0.f;
    float* rows = part[b].v[m.range * sp.n];
#pragma unroll
    for (int j = 0; j < kSlotChunks / 32; ++j) {
      if (j < nj) {
        acc += dot8(ws[j * 32 + lane], xs[c0 + lane]);
        c0 += 32;
        if (c0 == kc || j == nj - 1) {  // the row ends here, or the stage does
          float v = acc;
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == 0) rows[row * kMaxPieces + m.piece] = v;
          acc = 0.f;
          if (c0 == kc) {
            c0 = 0;
            ++row;
          }
        }
      }
    }
    __syncwarp();
    int last = 0;
    if (lane == 0) {
      __threadfence_block();
      last = atomicAdd(done + b, 1) == m.unit_stages - 1;
      if (last) __threadfence_block();
    }
    const bool is_last = __shfl_sync(0xffffffffu, last, 0);
    __syncwarp();  // orders the other lanes' reads of the partial buffer after lane 0's acquire fence
    if (is_last) {
      float(*pb)[kMaxPieces] = part[b].v;
      epilogue<OUT>(p, sp, m.unit, lane, [&](int r) {  // lane r's rows: cleared for the buffer's next unit
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < kMaxPieces; ++k) {
          v += pb[r][k];
          pb[r][k] = 0.f;
        }
        return v;
      });
      __syncwarp();
      if (lane == 0) {
        done[b] = 0;
        __threadfence_block();
        *reinterpret_cast<volatile int*>(owner + b) = m.q + nbuf;
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(s));
  }
#else
  __trap();  // launched only where kernel_has_sm90_code (gemv_stream_supported)
#endif
}

int max_dynamic_smem();

template <GemvOut OUT>
void launch_stream(const GemvParams& p, const StreamPlan& sp, size_t smem, cudaStream_t s) {
  auto* kernel = gemv_stream_kernel<OUT>;
  static bool raised = false;  // once per instantiation: the opt-in limit, which gemv_stream_supported checked against
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic_smem());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail_runtime(std::string("the streamed gemv's shared-memory limit could not be raised: ") + cudaGetErrorString(e));
    }
    raised = true;
  }
  // Resident blocks per SM at this ring size (queried once per instantiation and size, on the first, eager step:
  // nothing but the launch happens under capture); STREAM_BLOCKS asks for up to that many.
  static size_t queried_smem = ~size_t(0);
  static int per_sm = 1;
  if (smem != queried_smem) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1) {
      (void)cudaGetLastError();
      per_sm = 1;
    }
    queried_smem = smem;
  }
  int dev = 0, sms = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int blocks = std::max(1, std::min(sp.units, sms * std::clamp(p.stream_blocks_per_sm, 1, per_sm)));
  const cudaError_t e = launch_pdl(kernel, dim3(blocks), dim3(kThreads), smem, s, p, sp);
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of the streamed gemv failed: ") + cudaGetErrorString(e));
}

// The largest divisor of `of` that is <= want (>= 1).
int divisor_at_most(int of, int want) {
  for (int d = std::max(1, std::min(of, want)); d > 1; --d)
    if (of % d == 0) return d;
  return 1;
}

bool plan_stream(const GemvParams& p, StreamPlan& sp) {
  // A slot is always read by the same consumer warp (s % 8): its full-barrier phases are then waited in order.
  if (p.rows != 1 || p.k % 256 != 0 || !p.counters || p.stream_stages < 8 || p.stream_stages % 8 != 0) return false;
  const int row_bytes = p.k * 2;
  switch (p.epi) {
    case GemvOut::bf16:
    case GemvOut::add_f32: sp.layout = Layout::plain; sp.ranges = 1; break;
    case GemvOut::swiglu_bf16: sp.layout = Layout::pair; sp.ranges = 2; break;
    case GemvOut::rope_bf16: sp.layout = p.rope.interleaved ? Layout::rope_interleaved : Layout::rope_half; sp.ranges = p.rope.interleaved ? 1 : 2; break;
    default: return false;
  }
  if ((p.epi == GemvOut::add_f32) != (p.in == GemvIn::bf16)) return false;  // the instantiated prologue/epilogue pairs
  // ~16 KB of weights per unit.
  const int want = std::max(1, std::min(kMaxRangeRows, 16384 / (row_bytes * sp.ranges)));
  if (sp.layout == Layout::plain || sp.layout == Layout::pair) {
    sp.n = want;
    sp.units = (p.out + sp.n - 1) / sp.n;
  } else {
    const int half = p.rope.head_dim / 2;
    sp.n = sp.layout == Layout::rope_interleaved ? divisor_at_most(half, std::max(1, want / 2)) : divisor_at_most(half, want);
    sp.per_head = half / sp.n;
    sp.units = (p.rope.heads + 2 * p.rope.kv_heads) * sp.per_head;
  }
  sp.stages = p.stream_stages;
  const int range_rows_max = sp.layout == Layout::rope_interleaved ? 2 * sp.n : sp.n;
  if (size_t(range_rows_max) * row_bytes > size_t(kMaxPieces) * kSlotBytes) return false;  // pieces per range
  const int unit_bytes = sp.n * row_bytes * (sp.layout == Layout::rope_interleaved ? 2 : sp.ranges);
  sp.static_units = std::max(1, sp.stages * kSlotBytes / unit_bytes);
  sp.x_bytes = (p.k * 2 + 127) / 128 * 128;
  return true;
}

size_t stream_smem(const StreamPlan& sp) {
  const size_t nbuf = size_t(sp.stages) + kConsumerWarps;
  return size_t(sp.stages) * kSlotBytes + sp.x_bytes + sizeof(PartBuffer) * nbuf + sizeof(Meta) * sp.stages +
         2 * sizeof(int) * nbuf + 2 * sizeof(uint64_t) * sp.stages;
}

// The device's opt-in shared memory per block, less the kernel's static shared memory (1 KB is plenty).
int max_dynamic_smem() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return std::max(0, optin - 1024);
  }();
  return bytes;
}

bool device_has_sm90() {
  static const bool on = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major >= 9;
  }();
  return on;
}

}  // namespace

bool gemv_stream_supported(const GemvParams& p) {
  StreamPlan sp;
  if (!plan_stream(p, sp) || !device_has_sm90() || stream_smem(sp) > size_t(max_dynamic_smem())) return false;
  const void* kernel = p.epi == GemvOut::add_f32       ? reinterpret_cast<const void*>(gemv_stream_kernel<GemvOut::add_f32>)
                       : p.epi == GemvOut::swiglu_bf16 ? reinterpret_cast<const void*>(gemv_stream_kernel<GemvOut::swiglu_bf16>)
                       : p.epi == GemvOut::rope_bf16   ? reinterpret_cast<const void*>(gemv_stream_kernel<GemvOut::rope_bf16>)
                                                       : reinterpret_cast<const void*>(gemv_stream_kernel<GemvOut::bf16>);
  return ::flashlite::cuda::kernel_has_sm90_code(kernel);
}

void gemv_stream(const GemvParams& p, void* stream) {
  StreamPlan sp;
  if (!plan_stream(p, sp)) fail("streamed gemv: unsupported shape or epilogue (gemv_stream_supported says which)");
  const size_t smem = stream_smem(sp);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.epi) {
    case GemvOut::add_f32: launch_stream<GemvOut::add_f32>(p, sp, smem, s); break;
    case GemvOut::swiglu_bf16: launch_stream<GemvOut::swiglu_bf16>(p, sp, smem, s); break;
    case GemvOut::rope_bf16: launch_stream<GemvOut::rope_bf16>(p, sp, smem, s); break;
    default: launch_stream<GemvOut::bf16>(p, sp, smem, s); break;
  }
}

}  // namespace flashlite::engine::cuda_ops
