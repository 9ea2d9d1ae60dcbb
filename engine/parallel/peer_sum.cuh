#pragma once
// Device side of the LL protocol (NCCL's "low latency" one) that the one-shot all-reduce and the fused GEMV sum
// (peer_sum.h) share: a value travels beside its round's flag in one 8-byte word, which arrives whole, so a reader
// that sees the flag has the value (no fence, no separate flag write, one NVLink crossing).
#include <cstdint>

#include "engine/parallel/peer_sum.h"

namespace flashlite::engine::peer_sum {

// About 20 s: far past any step (first launches load modules; a peer's host may be capturing a graph), short of the
// host's own step deadline. The group's abort word (host memory) is read every millisecond of a wait, the first time
// 1 ms in; the first wait on a rank that gives up says so in the rank's `gave_up` word (device memory), which every
// wait past 2 us reads between its polls, so an aborted step drains in about a millisecond. A wait past 2 us (a peer
// that is late, not one whose word is in flight) polls every quarter microsecond instead of back to back. Both matter
// where thousands of warps wait at once (the fused GEMV sum: lane 0 of every warp, for each of its values): polling
// the host word from 50 us and back-to-back loads there stalled one decode step in 30 to 60 for 220-260 ms on 2 and 4
// H100s; the two together remove the stalls with the median step unchanged (which of the two it takes was not
// isolated). A fence after the stores removed them too, at 4-10% of the step.
constexpr unsigned long long kTimeoutNs = 20'000'000'000ULL;
constexpr unsigned long long kAbortPollNs = 1'000'000ULL;
constexpr unsigned long long kBackoffAfterNs = 2'000ULL;
constexpr unsigned kBackoffNs = 256;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The clock of one thread's waits: started at its first miss (most waits never read it).
struct Wait {
  unsigned long long t0 = 0, poll = 0;
  // After a miss: false when the wait is given up (timed out: reported in `error` and the group aborted; or the
  // group was aborted; or an earlier wait of this rank gave up).
  __device__ __forceinline__ bool go_on(int* error, int* abort, int* gave_up) {
    const unsigned long long now = global_ns();
    if (t0 == 0) {
      t0 = now;
      poll = now + kAbortPollNs;
      return true;
    }
    if (now - t0 > kBackoffAfterNs) {
      __nanosleep(kBackoffNs);
      if (*reinterpret_cast<volatile int*>(gave_up)) return false;
    }
    if (now - t0 > kTimeoutNs) {  // this rank reports it; every rank stops waiting
      *reinterpret_cast<volatile int*>(error) = 1;
      *reinterpret_cast<volatile int*>(abort) = 1;
      *reinterpret_cast<volatile int*>(gave_up) = 1;
      return false;
    }
    if (now > poll) {  // host memory: read only while waiting, never on the fast path
      poll = now + kAbortPollNs;
      if (*reinterpret_cast<volatile int*>(abort)) {
        *reinterpret_cast<volatile int*>(gave_up) = 1;
        return false;
      }
    }
    return true;
  }
};

__device__ __forceinline__ void store_word(void* at, float v, unsigned flag) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(at), "r"(__float_as_uint(v)), "r"(flag) : "memory");
}

__device__ __forceinline__ uint2 load_word(const void* at) {
  uint2 w;
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(w.x), "=r"(w.y) : "l"(at) : "memory");
  return w;
}

// Two words in one 16-byte access (the one-shot kernel's unit): {a, flag, b, flag}.
__device__ __forceinline__ void store_line(void* at, float a, float b, unsigned flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(__float_as_uint(a)), "r"(flag),
               "r"(__float_as_uint(b)), "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 load_line(const void* at) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(at)
               : "memory");
  return v;
}

// Where an inbox holds rank r's word `word` of round `round`, in 8-byte words from the inbox's start.
__device__ __forceinline__ size_t word_at(const PeerSum& q, unsigned round, int r, size_t word) {
  return size_t(round & 1u) * q.half_words + size_t(r) * q.rank_words + word;
}

// Element e of this rank's partial, `v`, stored into every peer's inbox under the element's next round (returned).
__device__ __forceinline__ unsigned send_to_peers(const PeerSum& q, size_t e, float v) {
  unsigned* counter = q.round + e;
  const unsigned round = *counter + 1;
  *counter = round;
  const size_t at = word_at(q, round, q.rank, e);
  for (int r = 0; r < q.ranks; ++r) {
    if (r != q.rank) store_word(static_cast<uint2*>(q.inbox[r]) + at, v, round);
  }
  return round;
}

// Element e summed over the ranks in rank order, `v` being this rank's and `round` what send_to_peers returned: the
// peers' words awaited in this rank's inbox. On a wait given up the sum is not complete (the step fails:
// Collective::check).
__device__ __forceinline__ float sum_from_peers(const PeerSum& q, size_t e, float v, unsigned round) {
  const uint2* mine = static_cast<const uint2*>(q.inbox[q.rank]) + word_at(q, round, 0, e);  // rank 0's word
  float sum = 0.f;
  Wait wait;
  bool ok = true;
  for (int r = 0; r < q.ranks; ++r) {
    float x = v;
    if (r != q.rank && ok) {
      const uint2* from = mine + size_t(r) * q.rank_words;
      uint2 w = load_word(from);
      while (w.y != round && (ok = wait.go_on(q.error, q.abort, q.gave_up))) w = load_word(from);
      x = __uint_as_float(w.x);
    }
    sum += x;
  }
  return sum;
}

}  // namespace flashlite::engine::peer_sum
