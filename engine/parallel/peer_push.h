#pragma once
// Where a GEMV that makes a rank's partial output of a row-parallel projection (O, down) also sends it for the
// one-shot sum (one_shot.h) that follows: each value as an 8-byte LL word {value, round} straight into every peer's
// inbox, stored by the warp that finished it. The peers' values then cross NVLink while the GEMV's other warps still
// stream weights, and the sum only waits for what has mostly arrived. The words land where the sum's own pushes
// would: the inbox half of the round's parity, the sending rank's region, word `element` (an LL line of the sum is
// two such words). The round of element e is the one the sum's block owning e will run next: round[e / round_span]
// + 1, read after the GEMV's wait for its predecessors (so after the previous sum moved the counter).
#include <cstddef>

namespace flashlite::engine {

struct PeerPush {
  static constexpr int kMaxRanks = 8;
  int rank = 0, ranks = 0;          // ranks < 2: nothing is pushed
  void* inbox[kMaxRanks] = {};      // every rank's inbox (peers' through peer access)
  const unsigned* round = nullptr;  // this rank's round counters, one per round_span elements
  int round_span = 0;
  size_t half_words = 0;  // 8-byte words in an inbox half (the halves alternate with the round's parity)
  size_t rank_words = 0;  // words of one rank's region in a half
};

}  // namespace flashlite::engine
