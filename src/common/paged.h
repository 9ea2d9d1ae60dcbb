#pragma once
// Paged KV-cache index math shared by the host (validation, the CPU backends) and the kernels (decode, prefill,
// append_kv), so that they cannot disagree.
#include "common/host_device.h"

namespace flashlite {

// Length of paged sequence b: `pages` pages of page_size tokens, the last holding last_page_len[b] tokens; 0 when it
// has no page (then last_page_len[b] is not read). I is the caller's integer type (int in the kernels, int64_t on the
// host): the arithmetic is done in it. (page_size and last_page_len[b] are read only when there is a page: the code
// generated is that of the expression written in place.)
template <class I, class L, class B>
FL_HD I paged_length(I pages, const I& page_size, const L* last_page_len, B b) {
  return pages == 0 ? I(0) : (pages - 1) * page_size + last_page_len[b];
}

}  // namespace flashlite
