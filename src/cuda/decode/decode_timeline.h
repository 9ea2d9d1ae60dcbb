#pragma once
// The decode kernels' diagnostic timeline (stamped only in builds with -DFLASHLITE_DECODE_TIMELINE=1): its layout and
// the hook that turns it on. No other includes, so callers outside src/ (the engine, the decode bench) can name it.
#include <cstddef>

namespace flashlite {

namespace cuda_decode {
inline constexpr int kTimelineStamps = 11;  // words per split block: 0..7, 9, 10 times, 8 the SM it ran on (%smid + 1)
}  // namespace cuda_decode

#if FLASHLITE_DECODE_TIMELINE
// Later decode launches stamp their split blocks' timelines into `buffer` (device memory, `slots` slots of
// slot_blocks x kTimelineStamps words, taken in turn per launch from slot 0, so a graph's last `slots` calls stay);
// null = off.
void cuda_decode_set_timeline(unsigned long long* buffer, size_t slot_blocks, size_t slots = 2);
#endif

}  // namespace flashlite
