// Host launch of the Hopper backward kernels (sm_90a objects only): the TMA tensor maps of q, k, v and dout and the
// choice of the variant (dtype, head_dim). No device allocation, no host sync: graph-capturable.
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "common/grid_order.h"
#include "cuda/bwd_hopper/bwd_hopper.h"
#include "cuda/bwd_hopper/bwd_hopper_kernel.cuh"
#include "cuda/common/tensor_map.h"
#include "flashlite/errors.h"

namespace flashlite::cuda_bwd_hopper {

static_assert(kKeysPerBlock == BwdHopperTile<64>::BN && kKeysPerBlock == BwdHopperTile<128>::BN,
              "dK/dV grid != kernel keys per CTA");
static_assert(kRowsPerBlock == BwdHopperTile<64>::BR && kRowsPerBlock == BwdHopperTile<128>::BR,
              "dQ grid != kernel rows per CTA");

void launch_bwd_hopper(const BackwardProblem& bp, const cuda_bwd::BwdParams& b, cudaStream_t stream) {
  const AttentionProblem& p = bp.fwd;
  constexpr const char* who = "Hopper attention backward";
  constexpr int box = BwdHopperTile<64>::BOX;
  HopperBwdParams hp;
  hp.b = b;
  const int q_block = p.head_dim == 64 ? BwdHopperTile<64>::BM : BwdHopperTile<128>::BM;  // dK/dV items' q rows
  hp.b.sink_block_first = sink_block_leads(p.mask, p.seq_q, p.seq_k, q_block, kKeysPerBlock);
  hp.key_blocks = int((p.seq_k + kKeysPerBlock - 1) / kKeysPerBlock);
  hp.row_blocks = int((p.seq_q + kRowsPerBlock - 1) / kRowsPerBlock);
  // The kernels zero the next varlen sequence's rows in tiles that cross a sequence's end (map_rows).
  const cuda::AttentionMaps maps = cuda::make_attention_maps(p, box, box, who);
  const cuda::MapRows rows = cuda::map_rows(p);
  hp.tq = maps.q, hp.tk = maps.k, hp.tv = maps.v;
  hp.tdo = cuda::make_tile_map(bp.dout, p.dtype, p.head_dim, rows.q, p.q_heads, rows.batch, bp.dout_stride, box, "dout",
                               who);
  const bool f16 = p.dtype == DType::f16;
  cudaError_t e;
  if (p.head_dim == 64) {
    e = f16 ? launch_bwd_hopper_variant<__half, 64>(hp, stream) : launch_bwd_hopper_variant<__nv_bfloat16, 64>(hp, stream);
  } else {
    e = f16 ? launch_bwd_hopper_variant<__half, 128>(hp, stream)
            : launch_bwd_hopper_variant<__nv_bfloat16, 128>(hp, stream);
  }
  if (e != cudaSuccess) throw Error(ErrorKind::runtime, std::string(who) + ": launch failed: " + cudaGetErrorString(e));
}

}  // namespace flashlite::cuda_bwd_hopper
