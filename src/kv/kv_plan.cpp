// Decode planning on the host: how many KV splits (flash-decoding), how they merge, how much workspace. Depends only on
// shapes, a length bound and what the device offers, never on device data: a plan made once serves a captured CUDA
// graph for as long as the lengths stay under its bound.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kv/kv_backends.h"

namespace flashlite {

int64_t decode_visible_keys_bound(const MaskParams& mask, int64_t q_len, int64_t kv_len) {
  if (mask.window_left < 0) return kv_len;
  // The q_len rows see at most window_left + q_len window keys (plus window_right past the last row, at most
  // kv_len) and the sink tokens.
  int64_t right = mask.window_right < 0 ? kv_len : mask.window_right;
  if (mask.causal) right = 0;  // no key past the last row's position
  return std::min(kv_len, int64_t(mask.window_left) + q_len + right + mask.sink_tokens);
}

int choose_num_splits(int64_t units, int64_t max_keys, int64_t slots, int tile_keys, int max_splits) {
  if (units <= 0 || max_keys <= 0 || slots <= 0) return 1;
  // Memory-bound: the device streams at full bandwidth once enough blocks are in flight; what costs is a second,
  // partly empty wave (tail) and, for few (sequence, head) pairs, too few blocks. So: one wave with as many splits
  // as the resident slots allow, each at least one key tile; no split at all once the pairs fill the device.
  if (units >= slots) return 1;
  const int64_t tiles = (max_keys + tile_keys - 1) / tile_keys;
  int64_t s = std::min<int64_t>({slots / units, tiles, int64_t(max_splits)});
  s = std::max<int64_t>(s, 1);
  // Even chunks: the fewest splits that give the same tiles per split (no split left without work at the bound).
  const int64_t per = (tiles + s - 1) / s;
  s = (tiles + per - 1) / per;
  return int(s);
}

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

size_t decode_workspace_bytes(const DecodeProblem& p, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t rows = size_t(p.cache.batch * p.q_heads * p.q_len);  // (batch, kv_head, group row)
  return align256(rows * size_t(num_splits) * size_t(p.cache.head_dim) * sizeof(float)) +
         align256(rows * size_t(num_splits) * sizeof(float));
}

std::string plan_cuda_decode(const DecodeProblem& p, int64_t bound, const DecodeOverrides& o, const CudaDecodeDevice& d,
                             CudaDecodeLaunch& out) {
  const int64_t row_chunks = (p.group() * p.q_len + kDecodeRowsPerBlock - 1) / kDecodeRowsPerBlock;
  const int64_t units = p.cache.batch * p.cache.kv_heads * row_chunks;  // (sequence, kv head, row chunk) blocks
  out.splits = o.num_splits > 0 ? std::min(o.num_splits, kDecodeMaxSplits)
                                : choose_num_splits(units, decode_visible_keys_bound(p.mask, p.q_len, bound), d.slots,
                                                    kDecodeTileKeys, kDecodeMaxSplits);
  // The merge runs in a cluster where the splits fit one and, by default, the grid is at most one block per SM.
  // Measured on the H100: the cluster merge wins at one block per SM (batch 1: 8 kv heads x <= 16 splits) and loses at
  // two (the engine at batch 16: 2 splits x 128 pairs).
  const bool fits = out.splits > 1 && out.splits <= d.cluster_splits;
  if (o.merge == DecodeMerge::cluster && !fits) {
    return "the cluster merge needs more than one split and at most " + std::to_string(d.cluster_splits) +
           " splits per cluster on this device (0: no sm_90 cluster launch); the plan has " + std::to_string(out.splits);
  }
  out.cluster_merge = o.merge == DecodeMerge::cluster ||
                      (o.merge == DecodeMerge::automatic && fits && units * out.splits <= d.sms);
  // K/V read with an L2 evict-first policy when the call's K/V (bounded by the longest sequence now) is at least half
  // the L2: its lines cannot survive until the next step, and under the normal policy they push out the small data
  // the kernels wait on. H100: b1 kv8192 / kv32768 -0.4 / -0.9 us, equal at batch 16 / 64; the engine at batch 1
  // (1.3 MB per call, its whole cache fits the L2 between steps) lost 1.1% with it, so small calls keep the normal one.
  const int64_t kv_bytes =
      p.cache.batch * p.cache.max_length * p.cache.kv_heads * p.cache.head_dim * 2 * int64_t(dtype_size(p.cache.dtype));
  out.kv_evict_first = 2 * kv_bytes >= d.l2_bytes;
  out.pdl = d.sm90_code;  // programmatic dependent launches: sm_90 code with its griddepcontrol.wait
  return {};
}

}  // namespace flashlite
