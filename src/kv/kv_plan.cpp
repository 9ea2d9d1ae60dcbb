// Decode planning on the host: how many KV splits (flash-decoding) and how much workspace. Depends only on shapes,
// a length bound and the device's resident-block count, never on device data: a plan made once serves a captured
// CUDA graph for as long as the lengths stay under its bound.
#include <algorithm>
#include <cstdint>

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

}  // namespace flashlite
