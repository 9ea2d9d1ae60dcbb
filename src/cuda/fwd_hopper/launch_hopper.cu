// Host launch of the Hopper forward kernel (sm_90a objects only): the TMA tensor maps of q, k, v and the choice of
// the variant (dtype, head_dim). Tensor maps are encoded per call on the host (cuTensorMapEncodeTiled, reached
// through the runtime's driver entry-point query, so the library does not link libcuda) and passed by value in
// the kernel parameters: no host sync, graph-capturable like the mma.sync kernel. The dynamic schedule's 4-byte tile
// counter (below) lives in the forward's workspace (launch.cu: the caller's, else allocated for the call); the launch
// zeroes it on the stream (under capture a memset node).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

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

void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, HopperShape shape, int ctas,
                       cudaStream_t stream) {
  HopperParams hp;
  hp.f = f;
  const cuda::AttentionMaps maps =
      cuda::make_attention_maps(p, shape.block_rows, kBlockKeys, "Hopper attention kernel");
  hp.tq = maps.q, hp.tk = maps.k, hp.tv = maps.v;
  // One persistent CTA per SM (shared memory and the threads' registers hold one per SM), fewer for fewer tiles.
  ctas = hopper_grid(f, ctas, int(p.device.index));
  // Tiles of unequal work (causal, windows, varlen) take the dynamic schedule when there are more of them than CTAs:
  // the workspace's counter (f.tile_counter_space), zeroed on the stream before the launch (graph-capturable).
  // Uniform tiles walk the static one.
  hp.tile_counter = nullptr;
  if (hopper_dynamic_schedule(p, f, ctas)) {
    if (f.tile_counter_space == nullptr) fail("no tile counter in the workspace (launch.cu)");
    hp.tile_counter = f.tile_counter_space;
    if (const cudaError_t e = cudaMemsetAsync(hp.tile_counter, 0, sizeof(unsigned), stream); e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(std::string("zeroing the tile counter failed: ") + cudaGetErrorString(e));
    }
  }
  const bool f16 = p.dtype == DType::f16;
  const int d = int(p.head_dim), rows = shape.block_rows, pb = shape.p_buffers;
  cudaError_t e = cudaErrorInvalidConfiguration;
  bool found = false;
#define FL_HOPPER_PICK(T, D, C, P)                                                                       \
  if (!found && f16 == std::is_same_v<T, __half> && d == D && rows == 64 * C && pb == P) {             \
    found = true;                                                                                       \
    e = launch_hopper_variant<T, D, C, P>(hp, ctas, stream);                                            \
  }
  FL_HOPPER_VARIANTS(FL_HOPPER_PICK)
#undef FL_HOPPER_PICK
  if (!found) {
    fail("no variant for head_dim " + std::to_string(d) + ", " + std::to_string(rows) + "-row tiles and " +
         std::to_string(pb) + " P buffers (hopper_shape plans only those of FL_HOPPER_VARIANTS)");
  }
  if (e != cudaSuccess) fail(std::string("launch failed: ") + cudaGetErrorString(e));
}

}  // namespace flashlite::cuda_fwd_hopper
