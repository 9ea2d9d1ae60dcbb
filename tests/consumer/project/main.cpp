// A user of the installed library: one small GQA causal attention on the CPU, checked against a plain loop here,
// plus the version and the error type. Exits non-zero on any mismatch.
#include <flashlite/attention.h>
#include <flashlite/errors.h>
#include <flashlite/version.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr int B = 1, SQ = 3, SK = 5, HQ = 4, HKV = 2, D = 8;

// Causal, bottom-right aligned: query i sees keys j <= i + (SK - SQ).
double expected(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int i, int h, int c) {
  const int kh = h / (HQ / HKV);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s;
  double m = -INFINITY;
  for (int j = 0; j <= i + (SK - SQ); ++j) {
    double dot = 0;
    for (int x = 0; x < D; ++x) dot += double(q[(i * HQ + h) * D + x]) * k[(j * HKV + kh) * D + x];
    s.push_back(dot * scale);
    m = std::max(m, dot * scale);
  }
  double sum = 0, acc = 0;
  for (size_t j = 0; j < s.size(); ++j) sum += std::exp(s[j] - m);
  for (size_t j = 0; j < s.size(); ++j) acc += std::exp(s[j] - m) / sum * v[(j * HKV + kh) * D + c];
  return acc;
}

}  // namespace

int main() {
  using namespace flashlite;
  if (std::strcmp(version(), EXPECTED_VERSION) != 0) {
    std::printf("version %s, package says %s\n", version(), EXPECTED_VERSION);
    return 1;
  }
  std::vector<float> q(B * SQ * HQ * D), k(B * SK * HKV * D), v(B * SK * HKV * D);  // (batch, seq, heads, head_dim)
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i) + 0.1f);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.53f * float(i) + 0.2f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.71f * float(i) + 0.3f);

  int failures = 0;
  for (Backend backend : {Backend::automatic, Backend::naive, Backend::reference}) {
    std::vector<float> out(q.size(), NAN), lse(B * HQ * SQ, NAN);
    AttentionOptions options;
    options.causal = true;
    forward(TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {B, SQ, HQ, D}),
            TensorView::contiguous(k.data(), DType::f32, Device::cpu(), {B, SK, HKV, D}),
            TensorView::contiguous(v.data(), DType::f32, Device::cpu(), {B, SK, HKV, D}),
            TensorView::contiguous(out.data(), DType::f32, Device::cpu(), {B, SQ, HQ, D}),
            TensorView::contiguous(lse.data(), DType::f32, Device::cpu(), {B, HQ, SQ}), options, backend);
    double err = 0;
    for (int i = 0; i < SQ; ++i)
      for (int h = 0; h < HQ; ++h)
        for (int c = 0; c < D; ++c) {
          const double e = std::fabs(out[(i * HQ + h) * D + c] - expected(q, k, v, i, h, c));
          err = std::isnan(e) ? INFINITY : std::max(err, e);
        }
    for (float x : lse) err = std::isfinite(x) ? err : INFINITY;
    std::printf("backend %-9s max abs err %.3g\n", backend_name(backend), err);
    failures += !(err < 1e-4);
  }

  try {
    parse_backend("bogus");
    ++failures;
  } catch (const Error& e) {
    std::printf("bad backend name rejected: %s\n", e.what());
  }
  std::printf("flashlite %s (FLASHLITE_WITH_CUDA=%d): %s\n", version(), FLASHLITE_WITH_CUDA, failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
