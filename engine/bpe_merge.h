#pragma once
// The BPE merge loop shared by every tokenizer: symbols in a doubly linked list, candidate pairs in a min-heap
// ordered by (priority, position), so the best pair is merged first and ties go to the leftmost pair. Stale heap
// entries (a side already merged) are skipped on pop. O(n log n) for a word of n symbols.
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace flashlite::engine {

struct MergeCandidate {
  double priority;  // lower merges first (a merge rank, or minus a piece score)
  int merged_id;
};

// `lookup(left_id, right_id)` returns the merge of that pair or nullopt. Rewrites `ids` in place.
template <typename Lookup>
void bpe_merge(std::vector<int>& ids, const Lookup& lookup) {
  const int n = int(ids.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Entry {
    double priority;
    int pos, left, right, merged;
    bool operator>(const Entry& o) const { return priority != o.priority ? priority > o.priority : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (std::optional<MergeCandidate> m = lookup(ids[pos], ids[next[pos]])) {
      heap.push({m->priority, pos, ids[pos], ids[next[pos]], m->merged_id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const int r = alive[e.pos] ? next[e.pos] : -1;
    if (r < 0 || ids[e.pos] != e.left || ids[r] != e.right) continue;  // stale
    ids[e.pos] = e.merged;
    alive[r] = false;
    next[e.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = e.pos;
    push(prev[e.pos]);
    push(e.pos);
  }
  std::vector<int> out;
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  ids = std::move(out);
}

}  // namespace flashlite::engine
