#pragma once
// The sm_90a instructions of the Hopper forward kernel besides wgmma itself: mbarriers (transaction counts), proxy
// fences, shared-memory stores, TMA tile loads (cp.async.bulk.tensor) completing on an mbarrier, wgmma fences and
// groups, shared-memory matrix descriptors, setmaxnreg. Compiled only for compute_90a (src/CMakeLists.txt).
#include <cuda.h>  // CUtensorMap (a type only: the driver is reached through the runtime's entry-point query)

#include <cstdint>

#include "cuda/common/mbarrier.cuh"

namespace flashlite::cuda_fwd_hopper {

// ------------------------------------------------------------------ mbarrier

using ::flashlite::cuda::mbar_arrive;  // init, arrive (expect_tx), parity wait: src/cuda/common/mbarrier.cuh
using ::flashlite::cuda::mbar_arrive_expect_tx;
using ::flashlite::cuda::mbar_init;
using ::flashlite::cuda::mbar_wait;

// Orders this thread's earlier generic-proxy shared-memory accesses (st.shared, mbarrier.init) before later
// async-proxy ones (TMA writes, wgmma operand reads); a barrier then extends that to the threads issuing them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Makes the initialised barriers visible to the other threads and to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  fence_proxy_async_smem();
}

// ------------------------------------------------------------------ shared-memory stores

// 16 zero bytes at a 16-byte aligned shared-memory address (generic proxy: fence_proxy_async_smem before an async
// reader).
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// A 32-bit word in shared memory, stored and loaded as ordered by the mbarrier operations around them (the memory
// clobbers keep the compiler from moving them across those).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint4 ld_shared_16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

// ------------------------------------------------------------------ TMA

// A 4-D box (c0 innermost) of the tensor described by `map` into shared memory at `dst`; completes `bytes` (the
// whole box, zero-filled where out of bounds) on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ------------------------------------------------------------------ wgmma bookkeeping

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers at this point of the program: the compiler may not move their reads or writes across
// it (used after wgmma_wait and before issuing, so no ordinary instruction touches an in-flight accumulator).
template <int N>
__device__ __forceinline__ void pin_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for 16-bit pairs that an in-flight wgmma reads as its A operand (kept live until after the wait).
template <int N>
__device__ __forceinline__ void pin_regs(uint32_t (&r)[N][2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (the layout TMA's CU_TENSOR_MAP_SWIZZLE_128B writes): start
// address, leading and stride byte offsets in 16-byte units, layout type 1 (128B) in bits 62-63. Tiles start on
// 1024-byte boundaries (the swizzle pattern repeats every 8 rows of 128 bytes), so the base offset field stays 0.
//   K-major operand (rows of 64 elements, 128 B apart): SBO = 1024 (next 8 rows), LBO unused (1).
//   N-major operand (V: keys x 64 columns per block): LBO = bytes between 64-column blocks, SBO = 1024 (next 8 keys).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

// ------------------------------------------------------------------ registers and barriers

template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barrier among `threads` threads (a multiple of 32), id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives on a named barrier without waiting (the other side waits with named_sync).
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace flashlite::cuda_fwd_hopper
