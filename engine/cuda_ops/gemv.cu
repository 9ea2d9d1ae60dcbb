#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/gemv_device.cuh"
#include "engine/cuda_ops/pdl.cuh"
#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

namespace {

using namespace gemv_device;
constexpr size_t kMaxStagedBytes = 160 * 1024;

// The staged rows' bytes this device takes: kMaxStagedBytes, less where its opt-in shared memory per block is smaller
// (sm_86 / sm_89: ~99 KB), with 1 KB left for the kernels' static shared memory. Without a device: kMaxStagedBytes
// (nothing launches then anyway).
size_t max_staged_bytes() {
  static const size_t bytes = [] {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= cuda_device_count()) {
      cudaGetLastError();
      return kMaxStagedBytes;
    }
    const int optin = cuda_device_info(dev).smem_optin;
    return optin > 0 ? std::min(kMaxStagedBytes, size_t(std::max(0, optin - 1024))) : kMaxStagedBytes;
  }();
  return bytes;
}

// The GEMV: block-uniform tiles (so that split-K and the fused RoPE epilogue can meet in shared memory), each warp's
// first batch of weights loaded before the wait. R: activation rows the kernel is unrolled for (p.rows <= R; rows
// beyond p.rows repeat the last one, unstored).
// Registers: a fixed budget, spill-free: 64 (4 blocks per SM) for a one-row bf16 input, 80 (3 blocks) for a one-row
// RMSNorm prologue (the preloaded batch lives through it; 64 spilled up to 52 bytes there) and for two rows, no cap
// for 4-8 rows. The launch sizes the grid from the occupancy this gives.
template <int R, GemvIn IN, GemvOut OUT>
__global__ void __maxnreg__(R > 2 ? 255 : R == 2 ? 80 : IN == GemvIn::bf16 ? 64 : 80) gemv_kernel(const GemvParams p) {
  extern __shared__ uint4 staged[];  // rmsnorm: (rows, k) bf16
  constexpr bool kRope = OUT == GemvOut::rope_bf16, kArgmax = OUT == GemvOut::f32_argmax;
  constexpr int NW = rows_per_warp<OUT>(), kUnroll = unroll<OUT>();
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? NW / 2 : NW;  // output columns per warp
  __shared__ float part[kWarps][NW][R];  // split-K partial sums; fused RoPE: the tile's bf16-rounded values
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kc = p.k >> 3;  // 16-byte chunks per row
  // Split-K: `S` warps share a row group, warp `sub` of them reducing chunks [c_begin, c_end).
  const int S = (OUT == GemvOut::swiglu_bf16 || kRope) ? 1 : p.split;
  const int per_tile = kWarps / S, sub = warp % S, slot = warp / S;
  const int slice = (kc + S - 1) / S, c_begin = min(kc, sub * slice), c_end = min(kc, c_begin + slice);
  const uint4* W = static_cast<const uint4*>(p.w);
  const int groups = (p.out + U - 1) / U;
  const int tiles = kRope ? p.out / 8 : (groups + per_tile - 1) / per_tile;
  // The output group (fused RoPE: the weight row) this warp owns in tile `t`; >= groups: none.
  auto group_of = [&](int t) { return kRope ? rope_slot(p.rope, t, warp).row : t * per_tile + slot; };
  // Weight rows of output group `grp`, row j of the warp (past the end: the last row again, never stored).
  auto weight_row = [&](int grp, int j) {
    const int u = min(grp * U + j % U, p.out - 1);
    return W + size_t(j < U ? u : p.out + u) * kc;
  };
  const uint64_t pol = weight_policy();
  uint4 wv[kUnroll][NW];  // one batch of loads: all issued before any math
  auto load_batch = [&](const uint4* const* wr, int c0) {
#pragma unroll
    for (int t = 0; t < kUnroll; ++t)
#pragma unroll
      for (int j = 0; j < NW; ++j) wv[t][j] = c0 + 32 * t < c_end ? load_stream(wr[j] + c0 + 32 * t, pol) : make_uint4(0, 0, 0, 0);
  };
  // Before waiting for the previous kernel: let the next one launch, and load this warp's first batch of weights into
  // registers (weights are never written by a predecessor, so this needs no wait).
  pdl_launch_dependents();
  bool preloaded = false;
  if (blockIdx.x < tiles) {
    const int first = group_of(blockIdx.x);
    if (first < groups) {
      const uint4* wr[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) wr[j] = weight_row(first, j);
      load_batch(wr, c_begin + lane);
      preloaded = true;
    }
  }
  const NormPre pre = norm_preload<R, IN>(p, kc);
  pdl_wait();
  const uint4* xrow[R];
  activation_rows<R, IN>(p, staged, xrow, lane, warp, kc, pre);

  uint64_t best[R];  // f32_argmax: this warp's largest key per activation row so far
#pragma unroll
  for (int r = 0; r < R; ++r) best[r] = 0;
  // Tiles are uniform across the block (the barriers of split-K and fused RoPE sit inside); warps whose group is
  // past the end idle through them.
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int grp = group_of(tile);
    const bool active = grp < groups;
    const int u0 = grp * U;
    float acc[NW][R];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[j][r] = 0.f;
    if (active) {
      const uint4* wr[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) wr[j] = weight_row(grp, j);
      for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * kUnroll) {
        if (!preloaded) load_batch(wr, c0);
        preloaded = false;
        dot_batch(acc, wv, xrow, c0, c_end);
      }
      warp_sum(acc);
    }
    preloaded = false;  // a lane with no chunk in its first tile never consumed its (empty) batch
    finish_tile<R, OUT>(p, acc, part, best, tile, warp, lane, active, S, sub, u0);
  }
  if constexpr (kArgmax) fold_argmax<R>(p, best, warp, lane);
}

int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return dev;
}

// The current device's SM count, cached per thread (tensor-parallel ranks are threads, each on its own device).
int sm_count() {
  thread_local int dev_cached = -1, n = 1;
  const int dev = current_device();
  if (dev != dev_cached) {
    n = dev < cuda_device_count() ? std::max(1, cuda_device_info(dev).sms) : 1;
    dev_cached = dev;
  }
  return n;
}

template <int R, GemvIn IN, GemvOut OUT>
void launch(const GemvParams& p, cudaStream_t s) {
  auto* kernel = gemv_kernel<R, IN, OUT>;
  const size_t smem = IN == GemvIn::rmsnorm ? size_t(p.rows) * p.k * 2 : 0;
  const int dev = current_device();
  if (smem > 48 * 1024) {
    // Once per instantiation and device (the limit belongs to the kernel in one device's context), once it succeeded.
    static std::atomic<uint64_t> raised{0};
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (bit == 0 || !(raised.load(std::memory_order_acquire) & bit)) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_staged_bytes()));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fail_runtime(std::string("the gemv's shared-memory limit could not be raised: ") + cudaGetErrorString(e));
      }
      raised.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? 1 : rows_per_warp<OUT>();
  const int S = (OUT == GemvOut::swiglu_bf16 || OUT == GemvOut::rope_bf16) ? 1 : p.split;
  const int groups = (p.out + U - 1) / U, per_tile = kWarps / S;
  const int tiles = OUT == GemvOut::rope_bf16 ? p.out / 8 : (groups + per_tile - 1) / per_tile;
  // One resident wave at most: the blocks per SM this kernel's registers and shared memory allow (queried once per
  // instantiation, staged size and device, per thread: tensor-parallel ranks are threads; on the first, eager step,
  // so nothing but the launch happens under capture).
  thread_local size_t queried_smem = ~size_t(0);
  thread_local int queried_dev = -1, per_sm = 1;
  if (smem != queried_smem || dev != queried_dev) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1) {
      cudaGetLastError();
      per_sm = 1;
    }
    queried_smem = smem;
    queried_dev = dev;
  }
  const int blocks = std::max(1, std::min(tiles, p.grid_blocks > 0 ? p.grid_blocks : sm_count() * per_sm));
  const cudaError_t e = launch_pdl(p.pdl, kernel, dim3(blocks), dim3(kThreads), smem, s, p);
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

template <GemvIn IN, GemvOut OUT>
void launch_rows(const GemvParams& p, cudaStream_t s) {
  if (p.rows <= 1) launch<1, IN, OUT>(p, s);
  else if (p.rows <= 2) launch<2, IN, OUT>(p, s);
  else if (p.rows <= 4) launch<4, IN, OUT>(p, s);
  else launch<8, IN, OUT>(p, s);
}

}  // namespace

int gemv_auto_split(int out, int k) {
  const int kc = k / 8;
  int s = 1;
  while (s < 8 && kc / (2 * s) >= 2 * 32 * 8 && int64_t(out) * 2 * s <= int64_t(sm_count()) * 4 * kWarps) s *= 2;
  return s;
}

bool gemv_supported(int rows, int k, bool staged) {
  return rows >= 1 && rows <= kGemvMaxRows && k > 0 && k % 8 == 0 && (!staged || size_t(rows) * k * 2 <= max_staged_bytes());
}

void gemv(const GemvParams& p, void* stream) {
  if (!gemv_supported(p.rows, p.k, p.in == GemvIn::rmsnorm)) {
    fail("gemv with " + std::to_string(p.rows) + " rows and k = " + std::to_string(p.k) + "; expected 1.." +
         std::to_string(kGemvMaxRows) + " rows, k a multiple of 8 and, with the RMSNorm prologue, rows x k x 2 bytes "
         "within " + std::to_string(max_staged_bytes()) + " bytes of shared memory");
  }
  if (p.split != 1 && p.split != 2 && p.split != 4 && p.split != 8) fail("gemv split " + std::to_string(p.split) + "; expected 1, 2, 4 or 8");
  if (p.epi == GemvOut::rope_bf16) {
    const GemvRope& r = p.rope;
    if (r.head_dim <= 0 || r.head_dim % 8 != 0 || p.out != (r.heads + 2 * r.kv_heads) * r.head_dim || !r.cos || !r.sin ||
        !r.pos || !r.cache_row || !r.k_cache || !r.v_cache) {
      fail("gemv with the RoPE epilogue needs head_dim a multiple of 8, out = (heads + 2 kv_heads) * head_dim and every "
           "table and cache pointer");
    }
  }
  if (p.epi == GemvOut::f32_argmax && !p.argmax_keys) fail("gemv with the argmax epilogue needs argmax_keys");
  if (const PeerSum& q = p.sum; p.epi == GemvOut::sum_f32) {
    bool inboxes = q.ranks <= PeerSum::kMaxRanks;
    for (int r = 0; inboxes && r < q.ranks; ++r) inboxes = q.inbox[r] != nullptr;
    // One resident wave (grid_blocks 0): a block waiting for its peers' values never keeps another block of its grid,
    // whose values some peer awaits, from starting. (Assumed: the occupancy the launch sizes the grid by is the
    // device's own; a GPU shared with other work, e.g. under MPS limits, still progresses as long as blocks start
    // in index order, as the hardware does them.)
    // A multiple of 4 elements: the one-shot kernel, which shares the round counters, moves them 4 at a time.
    const size_t n = size_t(p.rows) * size_t(std::max(p.out, 0));
    if (q.ranks < 2 || p.grid_blocks != 0 || !inboxes || q.rank < 0 || q.rank >= q.ranks || !q.round ||
        !q.error || !q.abort || !q.gave_up || n > q.rank_words || n % 4 != 0 ||
        size_t(q.ranks) * q.rank_words > q.half_words) {
      fail("gemv summing over ranks needs one resident wave, 2.." + std::to_string(PeerSum::kMaxRanks) +
           " ranks with an inbox each, its rank among them, the round counters, the error, abort and gave-up words, "
           "an inbox half that holds every rank's values, and rows x out a multiple of 4 within a rank's (" +
           std::to_string(q.rank_words) + " values)");
    }
  }
  if (p.out <= 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The combinations the engine uses: QKV, gate/up + SwiGLU and the LM head read the normed stream; O and down add.
  if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::bf16) launch_rows<GemvIn::rmsnorm, GemvOut::bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::swiglu_bf16) launch_rows<GemvIn::rmsnorm, GemvOut::swiglu_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32) launch_rows<GemvIn::rmsnorm, GemvOut::f32>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::rope_bf16) launch_rows<GemvIn::rmsnorm, GemvOut::rope_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32_argmax) launch_rows<GemvIn::rmsnorm, GemvOut::f32_argmax>(p, s);
  else if (p.in == GemvIn::bf16 && p.epi == GemvOut::add_f32) launch_rows<GemvIn::bf16, GemvOut::add_f32>(p, s);
  else if (p.in == GemvIn::bf16 && p.epi == GemvOut::sum_f32) launch_rows<GemvIn::bf16, GemvOut::sum_f32>(p, s);
  else fail("gemv: this prologue/epilogue combination is not instantiated");
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

}  // namespace flashlite::engine::cuda_ops
