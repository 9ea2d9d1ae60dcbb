#pragma once
// The all-reduce of a tensor-parallel decode step fused into the GEMV that makes each rank's partial output of a
// row-parallel projection (O, down): the warp that finished output element e stores it as an 8-byte LL word
// {value, round} into every peer's one-shot inbox (one_shot.h), waits for the peers' words of the same element in its
// own inbox, and adds the sum over ranks (in rank order: the same bits on every rank) to the residual stream. No sum
// kernel, no partial buffer, no kernel boundary between the GEMV and the sum. Each element has its own round counter,
// read and moved only by the thread that handles the element (the fused GEMV's, or the one-shot kernel's), so the two
// may follow each other in any order. Two inbox halves by round parity suffice: a peer stores element e's round k + 2
// only after its round k + 1 of e completed, which needed this rank's round k + 1 store of e, made after this rank
// read its round k of e (the GEMV or kernel of round k + 1 waits for its predecessors).
#include <cstddef>

namespace flashlite::engine {

struct PeerSum {
  static constexpr int kMaxRanks = 8;
  int rank = 0, ranks = 0;      // ranks < 2: no sum
  void* inbox[kMaxRanks] = {};  // every rank's inbox of 8-byte words (peers' through peer access)
  unsigned* round = nullptr;    // this rank's round counter of each element
  size_t half_words = 0;        // words in an inbox half (the halves alternate with the round's parity)
  size_t rank_words = 0;        // words of one rank's region in a half: word e of it holds element e
  int* error = nullptr;         // set when a wait gave up (about 20 s): the step fails
  int* abort = nullptr;         // the group's abort word: waits stop (the step fails, its sums do not matter)
  int* gave_up = nullptr;       // this rank's device word, set by the first of its waits that gives up: the others
                                //   (thousands, queued one after another) stop within microseconds, not 1 ms each
};

}  // namespace flashlite::engine
