// The pipelined one-row GEMV (gemv.h, GemvParams::pipe_stages; opt-in, FLASHLITE_ENGINE_PIPE): the variant kernel's
// work split (block-uniform tiles, split-K, the fused RoPE / argmax epilogues: gemv_device.cuh), but each lane's
// weight loads land in its warp's ring of shared-memory slots (cp.async, 4 KB per warp and slot) instead of
// registers. Why (docs/perf-notes.md, "Engine round 9"): the register kernel's loads in flight fill the register
// file, so the next GEMV's blocks become resident only as this one's retire and every GEMV restarts its weight
// stream after griddepcontrol.wait. Here a block needs ~40 registers a thread and `stages` x 32 KB of shared memory,
// so with one or two blocks per SM the next kernel's blocks fit beside it and issue their first stages - 1 slots
// of weights (which no predecessor writes) before their wait, while this one still streams.
// Each lane reads back only the chunks it copied itself, so a slot needs no barrier: cp.async.wait_group orders
// the lane's own copies before its reads, and a slot is refilled only after the same lane has consumed it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/gemv_device.cuh"
#include "engine/cuda_ops/pdl.cuh"
#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

namespace {

using namespace gemv_device;
constexpr int kMinStages = 2, kMaxStages = 6;
constexpr int kSlotChunks = 8;  // 16-byte chunks a lane moves per slot: kUnroll x rows per warp
constexpr size_t kSlotBytes = size_t(kSlotChunks) * 16 * 32;  // per warp: 4 KB

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// 16 bytes global -> shared, L2 only (weights are read once).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// At most `n` (the stages less one, 1..kMaxStages - 1) of this thread's copy groups still pending.
__device__ __forceinline__ void wait_pending(int n) {
  switch (n) {
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    default: cp_async_wait<5>(); break;
  }
}

template <GemvIn IN, GemvOut OUT>
__global__ void __launch_bounds__(kThreads) gemv_pipe_kernel(const GemvParams p) {
  constexpr int R = 1;
  constexpr bool kRope = OUT == GemvOut::rope_bf16, kArgmax = OUT == GemvOut::f32_argmax;
  constexpr int NW = rows_per_warp<OUT>(), kUnroll = unroll<OUT>();
  static_assert(NW * kUnroll == kSlotChunks, "a slot is one batch of the register kernel");
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? NW / 2 : NW;  // output columns per warp
  extern __shared__ uint4 ring[];  // (warp, stage, chunk, lane); then the staged row (rmsnorm)
  __shared__ float part[kWarps][NW][R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int P = p.pipe_stages;
  uint4* const my_ring = ring + size_t(warp) * P * kSlotChunks * 32;
  uint4* const staged = ring + size_t(kWarps) * P * kSlotChunks * 32;
  const int kc = p.k >> 3;
  const int S = (OUT == GemvOut::swiglu_bf16 || kRope) ? 1 : p.split;
  const int per_tile = kWarps / S, sub = warp % S, slot = warp / S;
  const int slice = (kc + S - 1) / S, c_begin = min(kc, sub * slice), c_end = min(kc, c_begin + slice);
  const int batches = (c_end - c_begin + 32 * kUnroll - 1) / (32 * kUnroll);  // per tile, this warp
  const uint4* W = static_cast<const uint4*>(p.w);
  const int groups = (p.out + U - 1) / U;
  const int tiles = kRope ? p.out / 8 : (groups + per_tile - 1) / per_tile;
  const int my_tiles = int(blockIdx.x) < tiles ? (tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  auto group_of = [&](int t) { return kRope ? rope_slot(p.rope, t, warp).row : t * per_tile + slot; };
  auto weight_row = [&](int grp, int j) {
    const int u = min(grp * U + j % U, p.out - 1);
    return W + size_t(j < U ? u : p.out + u) * kc;
  };

  // The producer's cursor over this warp's batches in consumption order: tile `pt` (the block's pt-th), batch `pb`.
  int pt = 0, pb = 0, issued = 0;
  auto issue_next = [&] {
    while (pt < my_tiles && (pb >= batches || group_of(int(blockIdx.x) + pt * int(gridDim.x)) >= groups)) ++pt, pb = 0;
    if (pt < my_tiles) {
      const int grp = group_of(int(blockIdx.x) + pt * int(gridDim.x));
      const int c0 = c_begin + lane + pb * 32 * kUnroll;
      const uint32_t dst = smem_addr(my_ring + size_t(issued % P) * kSlotChunks * 32 + lane);
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const uint4* wr = weight_row(grp, j);
#pragma unroll
        for (int t = 0; t < kUnroll; ++t)
          if (c0 + 32 * t < c_end) cp_async_16(dst + uint32_t(((t * NW + j) * 32) * 16), wr + c0 + 32 * t);
      }
      ++pb, ++issued;
    }
    cp_async_commit();  // empty once the warp's batches are all issued: the group count stays in step
  };

  // Before waiting for the previous kernel: let the next one launch, and put this warp's first stages - 1 slots of
  // weights on their way (weights are never written by a predecessor).
  pdl_launch_dependents();
  for (int s = 0; s < P - 1; ++s) issue_next();
  pdl_wait();
  const uint4* xrow[R];
  activation_rows<R, IN>(p, staged, xrow, lane, warp, kc);

  uint64_t best[R] = {0};
  int consumed = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int grp = group_of(tile);
    const bool active = grp < groups;
    const int u0 = grp * U;
    float acc[NW][R];
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[j][0] = 0.f;
    if (active) {
      for (int b = 0; b < batches; ++b) {
        issue_next();        // the batch stages - 1 ahead, into the slot consumed last
        wait_pending(P - 1);  // this batch's group has landed
        const uint4* src = my_ring + size_t(consumed % P) * kSlotChunks * 32 + lane;
        const int c0 = c_begin + lane + b * 32 * kUnroll;
        uint4 wv[kUnroll][NW];
#pragma unroll
        for (int t = 0; t < kUnroll; ++t)
#pragma unroll
          for (int j = 0; j < NW; ++j) wv[t][j] = c0 + 32 * t < c_end ? src[(t * NW + j) * 32] : make_uint4(0, 0, 0, 0);
        ++consumed;
        dot_batch(acc, wv, xrow, c0, c_end);
      }
      warp_sum(acc);
    }
    finish_tile<R, OUT>(p, acc, part, best, tile, warp, lane, active, S, sub, u0);
  }
  cp_async_wait<0>();  // nothing is left in flight (all groups past the last batch are empty)
  if constexpr (kArgmax) fold_argmax<R>(p, best, warp, lane);
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms > 0 ? sms : 1;
  }();
  return n;
}

size_t pipe_smem(const GemvParams& p) {
  return size_t(kWarps) * p.pipe_stages * kSlotBytes + (p.in == GemvIn::rmsnorm ? size_t(p.k) * 2 : 0);
}

int optin_smem() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return optin;
  }();
  return bytes;
}

template <GemvIn IN, GemvOut OUT>
void launch(const GemvParams& p, cudaStream_t s) {
  auto* kernel = gemv_pipe_kernel<IN, OUT>;
  const size_t smem = pipe_smem(p);
  static bool raised = false;  // once per instantiation (the limit is per kernel), once it succeeded
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin_smem() - 1024);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail_runtime(std::string("the pipelined gemv's shared-memory limit could not be raised: ") + cudaGetErrorString(e));
    }
    raised = true;
  }
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? 1 : rows_per_warp<OUT>();
  const int S = (OUT == GemvOut::swiglu_bf16 || OUT == GemvOut::rope_bf16) ? 1 : p.split;
  const int groups = (p.out + U - 1) / U, per_tile = kWarps / S;
  const int tiles = OUT == GemvOut::rope_bf16 ? p.out / 8 : (groups + per_tile - 1) / per_tile;
  // At most pipe_blocks_per_sm blocks per SM, fewer where shared memory does not hold them (queried once per
  // instantiation and size, on the first, eager step).
  static size_t queried_smem = ~size_t(0);
  static int per_sm = 1;
  if (smem != queried_smem) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1) {
      cudaGetLastError();
      per_sm = 1;
    }
    queried_smem = smem;
  }
  const int blocks = std::max(1, std::min(tiles, sm_count() * std::min(per_sm, std::max(1, p.pipe_blocks_per_sm))));
  const cudaError_t e = launch_pdl(kernel, dim3(blocks), dim3(kThreads), smem, s, p);
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of the pipelined gemv failed: ") + cudaGetErrorString(e));
}

}  // namespace

bool gemv_pipe_supported(const GemvParams& p) {
  if (p.rows != 1 || p.pipe_stages < kMinStages || p.pipe_stages > kMaxStages || p.k <= 0 || p.k % 8 != 0) return false;
  return pipe_smem(p) + 1024 <= size_t(optin_smem());
}

void gemv_pipe(const GemvParams& p, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::bf16) launch<GemvIn::rmsnorm, GemvOut::bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::swiglu_bf16) launch<GemvIn::rmsnorm, GemvOut::swiglu_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32) launch<GemvIn::rmsnorm, GemvOut::f32>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::rope_bf16) launch<GemvIn::rmsnorm, GemvOut::rope_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32_argmax) launch<GemvIn::rmsnorm, GemvOut::f32_argmax>(p, s);
  else if (p.in == GemvIn::bf16 && p.epi == GemvOut::add_f32) launch<GemvIn::bf16, GemvOut::add_f32>(p, s);
  else fail("gemv: this prologue/epilogue combination is not instantiated");
}

}  // namespace flashlite::engine::cuda_ops
