#pragma once
// mbarrier wrappers shared by the sm_90 kernels that wait on transaction counts (the Hopper forward kernel's TMA
// pipeline, the engine's streamed GEMV): init, arrive (optionally announcing async-copy bytes) and a parity wait.
// The instructions exist only on sm_90 (expect_tx / try_wait.parity); callers compile them only there.
#include <cstdint>

namespace flashlite::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of async-copy transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Whether the phase with the given parity has completed (a fresh barrier counts parity 1 as completed); the thread
// may be suspended a while first.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// mbar_wait that gives up: after 2^28 unsuccessful tries (each may suspend the thread for a while, so many seconds;
// far past any legitimate wait for a TMA load or a consumer warp) the kernel traps, so a protocol bug fails the
// launch with an error instead of hanging the GPU. Used by the Hopper backward, written after the forward; one counter
// register more than mbar_wait.
__device__ __forceinline__ void mbar_wait_or_trap(uint32_t bar, uint32_t parity) {
  for (uint32_t tries = 0; !mbar_try_wait(bar, parity); ++tries) {
    if (tries == (1u << 28)) __trap();
  }
}

}  // namespace flashlite::cuda
