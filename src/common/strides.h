#pragma once
// Element strides of the tensors every backend reads, one struct per tensor in the problems (common/problem.h) and in
// the kernel parameter structs (cuda/*/..._params.h), so a launcher copies a tensor's strides in one assignment.
// Plain data: the same type on the host and in __grid_constant__ kernel arguments.
#include <cstdint>

#include "common/host_device.h"

namespace flashlite {

// A [batch, seq, heads, head_dim] view (head_dim contiguous). For a KV cache, `batch` steps a sequence (contiguous)
// or a page (paged) and `seq` a slot.
struct RowStrides {
  int64_t batch = 0, seq = 0, head = 0;
  FL_HD int64_t offset(int64_t b, int64_t row, int64_t h) const { return b * batch + row * seq + h * head; }
};

// Whether every row of a view of 2-byte elements (`batch` x `heads` rows per position) starts 16-byte aligned, as the
// kernels' 16-byte copies need. Strides of size-1 dimensions do not matter.
inline bool rows_16byte_aligned(const void* base, const RowStrides& s, int64_t batch, int64_t heads) {
  const auto ok = [](int64_t stride) { return (stride * 2) % 16 == 0; };
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && ok(s.seq) && (batch <= 1 || ok(s.batch)) &&
         (heads <= 1 || ok(s.head));
}

// An LSE view [batch, heads, seq]: the fields in the view's order.
struct LseStrides {
  int64_t batch = 0, head = 0, seq = 0;
  FL_HD int64_t offset(int64_t b, int64_t h, int64_t row) const { return b * batch + h * head + row * seq; }
};

}  // namespace flashlite
