// Host launch of the Hopper forward kernel (sm_90a objects only): the TMA tensor maps of q, k, v and the choice of
// the variant (dtype, head_dim). Tensor maps are encoded per call on the host (cuTensorMapEncodeTiled, reached
// through the runtime's driver entry-point query, so the library does not link libcuda) and passed by value in
// the kernel parameters: no host sync, graph-capturable like the mma.sync kernel. The dynamic schedule's 4-byte tile
// counter (below) lives in the caller's workspace when there is one (forward_workspace_bytes counts it; under capture
// a memset node, no memory node); only without a workspace is it allocated per call, stream-ordered (cudaMallocAsync
// / cudaFreeAsync: memory nodes under capture).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/device_props.h"
#include "cuda/common/host_copy.h"
#include "cuda/common/tensor_map.h"
#include "cuda/fwd_hopper/hopper_fwd.h"
#include "cuda/fwd_hopper/hopper_kernel.cuh"
#include "flashlite/errors.h"

namespace flashlite::cuda_fwd_hopper {

// The tensor maps' boxes (block_rows / kBlockKeys rows, 64 columns) are what the kernel's expect_tx byte counts and
// descriptors assume (HopperTile: 64 rows per consumer warpgroup); the FwdParams' query tiles are made for the same
// block_rows (the plan's, hopper_shape).
static_assert(HopperTile<64, 2, 2>::BR == 128 && HopperTile<64, 3, 1>::BR == 192 && HopperTile<128, 2, 1>::BR == 128,
              "Q box rows != kernel tile rows");
static_assert(kBlockKeys == HopperTile<64, 3, 1>::BC && kBlockKeys == HopperTile<128, 2, 2>::BC,
              "K/V box rows != tile keys");
static_assert(HopperTile<128, 2, 2>::SMEM_BYTES <= 227u * 1024u, "over the sm_90 opt-in shared memory per block");

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorKind::runtime, "Hopper attention kernel: " + what);
}

}  // namespace

void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, int block_rows, int ctas,
                       cudaStream_t stream) {
  const HopperShape shape = hopper_shape(p);
  if (block_rows != shape.block_rows) {
    fail("planned for " + std::to_string(block_rows) + "-row tiles, but the problem takes " +
         std::to_string(shape.block_rows));
  }
  HopperParams hp;
  hp.f = f;
  const cuda::AttentionMaps maps = cuda::make_attention_maps(p, block_rows, kBlockKeys, "Hopper attention kernel");
  hp.tq = maps.q, hp.tk = maps.k, hp.tv = maps.v;
  // One persistent CTA per SM (shared memory and the threads' registers hold one per SM), fewer for fewer tiles.
  const int64_t work_tiles = int64_t(f.q_tiles) * f.q_heads * f.batch;
  if (ctas <= 0) ctas = cuda::device_props(int(p.device.index)).sms;
  ctas = int(std::min<int64_t>(work_tiles, ctas));
  // Tiles of unequal work (causal, windows, varlen) take the dynamic schedule: a counter zeroed on the stream before
  // the launch (graph-capturable). It is the caller's workspace's (f.tile_counter_space, launch.cu) when one was
  // passed; else it is allocated stream-ordered here and freed after the launch. Uniform tiles walk the static one.
  const bool uneven = cuda_fwd::uneven_tiles(p.mask, p.varlen());
  cuda::CallBuffer counter(stream);
  hp.tile_counter = nullptr;
  if (uneven && ctas < work_tiles) {
    cudaError_t taken = cudaSuccess;
    hp.tile_counter = f.tile_counter_space;
    if (hp.tile_counter == nullptr) {
      taken = cudaMallocAsync(&counter.ptr, sizeof(unsigned), stream);
      hp.tile_counter = static_cast<unsigned*>(counter.ptr);
    }
    if (taken == cudaSuccess) taken = cudaMemsetAsync(hp.tile_counter, 0, sizeof(unsigned), stream);
    if (taken != cudaSuccess) {
      (void)cudaGetLastError();
      fail(std::string("taking the tile counter failed: ") + cudaGetErrorString(taken));
    }
  }
  const bool f16 = p.dtype == DType::f16;
  cudaError_t e;
  if (p.head_dim == 64 && shape.block_rows == 192) {
    e = f16 ? launch_hopper_variant<__half, 64, 3, 1>(hp, ctas, stream)
            : launch_hopper_variant<__nv_bfloat16, 64, 3, 1>(hp, ctas, stream);
  } else if (p.head_dim == 64) {
    e = f16 ? launch_hopper_variant<__half, 64, 2, 2>(hp, ctas, stream)
            : launch_hopper_variant<__nv_bfloat16, 64, 2, 2>(hp, ctas, stream);
  } else if (shape.p_buffers == 1) {
    e = f16 ? launch_hopper_variant<__half, 128, 2, 1>(hp, ctas, stream)
            : launch_hopper_variant<__nv_bfloat16, 128, 2, 1>(hp, ctas, stream);
  } else {
    e = f16 ? launch_hopper_variant<__half, 128, 2, 2>(hp, ctas, stream)
            : launch_hopper_variant<__nv_bfloat16, 128, 2, 2>(hp, ctas, stream);
  }
  if (e != cudaSuccess) fail(std::string("launch failed: ") + cudaGetErrorString(e));
  if (const cudaError_t freed = counter.free_now(); freed != cudaSuccess) {
    fail(std::string("freeing the tile counter failed: ") + cudaGetErrorString(freed));
  }
}

}  // namespace flashlite::cuda_fwd_hopper
