#pragma once
// Shared by the backward suites (tests/cpu/backward_test.cpp, tests/gpu/backward_test.cpp): the float64 gradients of a
// problem by reference_backward_f64, laid out [tensor batch, rows, heads, head_dim] contiguous, and their scale.
#include <algorithm>
#include <cmath>
#include <vector>

#include "flashlite/backward.h"
#include "test_util.h"

namespace fltest {

struct Grads64 {
  std::vector<double> dq, dk, dv, dsink;
};

// args: host (CPU) views of the problem spec s describes; NaN where no sequence owns a row.
inline Grads64 reference_grads(const Spec& s, const flashlite::BackwardArgs& args) {
  Grads64 r;
  r.dq.assign(size_t(s.tensor_batch() * s.rows_q() * s.hq * s.d), std::nan(""));
  r.dk.assign(size_t(s.tensor_batch() * s.rows_k() * s.hkv * s.d), std::nan(""));
  r.dv.assign(r.dk.size(), std::nan(""));
  r.dsink.assign(size_t(s.hq), std::nan(""));
  flashlite::reference_backward_f64(args, r.dq.data(), r.dk.data(), r.dv.data(), r.dsink.data());
  return r;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The padding of a strided gradient buffer (elements no view covers) is still the poison.
inline void expect_padding_untouched(const Buffer& buf, const TensorView& t, const char* name) {
  std::vector<char> covered(size_t(buf.numel()), 0);
  const int64_t base = (static_cast<const uint8_t*>(t.data) - buf.bytes.data()) / int64_t(elem_size(buf.dtype));
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t r = 0; r < t.shape[1]; ++r)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t c = 0; c < t.shape[3]; ++c) covered[size_t(base + offset4(t, b, r, h, c))] = 1;
  for (int64_t i = 0; i < buf.numel(); ++i) {
    if (!covered[size_t(i)] && !std::isnan(load(buf.dtype, buf.bytes.data(), i))) {
      ADD_FAILURE() << name << ": padding element " << i << " was written";
      return;
    }
  }
}

}  // namespace fltest
