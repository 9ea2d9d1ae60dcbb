#include "engine/cuda_ops/step_timeline.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/cuda_ops/gemv.h"
#include "src/cuda/decode/decode_timeline.h"

namespace flashlite::engine::cuda_ops {

namespace {

constexpr int kDecodeWords = cuda_decode::kTimelineStamps, kGemvWords = kGemvTimelineStamps;

// (first, median, last) of stamp k over a slot's blocks that ran (their `ran` stamp nonzero), in ns.
struct Spread {
  double lo = 0, med = 0, hi = 0;
  int n = 0;
};
Spread spread(const unsigned long long* slot, int words, int k, int ran) {
  std::vector<unsigned long long> v;
  for (size_t b = 0; b < StepTimeline::kBlocks; ++b)
    if (slot[b * words + ran] && slot[b * words + k]) v.push_back(slot[b * words + k]);
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {double(v.front()), double(v[v.size() / 2]), double(v.back()), int(v.size())};
}

}  // namespace

size_t StepTimeline::decode_words() const { return size_t(layers) * kBlocks * kDecodeWords; }
size_t StepTimeline::words() const { return decode_words() + (size_t(layers) * kSites + 1) * kBlocks * kGemvWords; }
size_t StepTimeline::gemv_offset(int layer, int site) const {
  return decode_words() + (size_t(layer) * kSites + site) * kBlocks * kGemvWords;
}

void print_step_timeline(const StepTimeline& t, const unsigned long long* host, std::FILE* out) {
  const char* names[5] = {"qkv", "attn", "o", "gate/up", "down"};
  std::fprintf(out, "timeline of the last decode step (us from layer l's QKV first start; per kernel: first start / "
                    "median after wait / last end; attention also: length, q+issue, first tile, loop end, partials "
                    "(medians), the same stamps' latest block, the cluster merge's first barrier and merge (median / latest) and the median end)\n");
  double gap[5] = {0}, run[5] = {0}, prologue[5] = {0};
  int counted = 0;
  for (int l = 0; l < t.layers; ++l) {
    const double t0 = spread(host + t.gemv_offset(l, 0), kGemvWords, 0, 0).lo;
    auto us = [&](double ns) { return (ns - t0) / 1e3; };
    std::string line = "  layer " + std::to_string(l) + ":";
    char buf[512];
    double ends[5] = {0}, waits[5] = {0}, waited[5] = {0};
    for (int k = 0; k < 5; ++k) {
      if (k == 1) {  // the decode kernel: 0 start, 1 after the wait, 7 length, 2 q + issue, 3 first tile, 4 loop end,
                     // 5 partials, 6 end; 8 ran
        const unsigned long long* d = host + size_t(l) * StepTimeline::kBlocks * kDecodeWords;
        auto s = [&](int stamp) { return spread(d, kDecodeWords, stamp, 8); };
        const Spread s0 = s(0), s1 = s(1), s6 = s(6);
        std::snprintf(buf, sizeof buf,
                      " | attn(%d) %.2f / %.2f / %.2f [len %.2f q %.2f tile %.2f loop %.2f part %.2f; last block: start "
                      "%.2f wait %.2f len %.2f q %.2f tile %.2f loop %.2f part %.2f; cluster barrier %.2f / %.2f, merged %.2f "
                      "/ %.2f; median end %.2f]",
                      s0.n, us(s0.lo), us(s1.med), us(s6.hi), us(s(7).med), us(s(2).med), us(s(3).med), us(s(4).med),
                      us(s(5).med), us(s0.hi), us(s1.hi), us(s(7).hi), us(s(2).hi), us(s(3).hi), us(s(4).hi),
                      us(s(5).hi), us(s(9).med), us(s(9).hi), us(s(10).med), us(s(10).hi), us(s6.med));
        waits[k] = s1.med, ends[k] = s6.hi;
      } else {  // a GEMV: 0 start, 1 after the wait and prologue, 2 end, 3 after the wait, 4 prologue loads arrived
        const unsigned long long* g = host + t.gemv_offset(l, k == 0 ? 0 : k - 1);
        auto s = [&](int stamp) { return spread(g, kGemvWords, stamp, 0); };
        const Spread s0 = s(0), s1 = s(1), s2 = s(2), s3 = s(3), s4 = s(4);
        std::snprintf(buf, sizeof buf, " | %s(%d) %.2f / %.2f [waited %.2f x %.2f] / %.2f", names[k], s0.n, us(s0.lo),
                      us(s1.med), us(s3.med), s4.n ? us(s4.med) : 0.0, us(s2.hi));
        waited[k] = s3.med, waits[k] = s1.med, ends[k] = s2.hi;
      }
      line += buf;
    }
    std::fprintf(out, "%s\n", line.c_str());
    if (l == 0) continue;  // layer 0's QKV follows the embedding, not a down GEMV
    ++counted;
    for (int k = 0; k < 5; ++k) {  // previous end -> median past the prologue, that -> last end
      if (k > 0) gap[k] += (waits[k] - ends[k - 1]) / 1e3;
      run[k] += (ends[k] - waits[k]) / 1e3;
      if (k > 0 && waited[k] > 0) prologue[k] += (waits[k] - waited[k]) / 1e3;
    }
  }
  if (counted == 0) return;
  std::fprintf(out, "  mean over layers 1..: ");
  for (int k = 0; k < 5; ++k)
    std::fprintf(out, "%s gap %.2f (prologue %.2f) run %.2f%s", names[k], gap[k] / counted, prologue[k] / counted,
                 run[k] / counted, k < 4 ? " | " : "\n");
}

}  // namespace flashlite::engine::cuda_ops
