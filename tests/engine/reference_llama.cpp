#include "reference_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace reftest {

std::string models_dir() {
  if (const char* e = std::getenv("FLASHLITE_MODELS")) return e;
  return FLASHLITE_TEST_MODELS_DIR;
}

bool read_llama2c(const std::string& path, RefModel& m) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  int32_t h[7];
  if (std::fread(h, 4, 7, f) != 7) {
    std::fclose(f);
    return false;
  }
  m.dim = h[0];
  m.hidden = h[1];
  m.layers = h[2];
  m.heads = h[3];
  m.kv_heads = h[4];
  m.tied = h[5] > 0;
  m.vocab = std::abs(h[5]);
  m.seq_len = h[6];
  m.head_dim = m.dim / m.heads;
  m.interleaved = true;
  auto read = [&](size_t n) {
    std::vector<float> tmp(n);
    if (std::fread(tmp.data(), 4, n, f) != n) tmp.clear();
    return std::vector<double>(tmp.begin(), tmp.end());
  };
  auto per_layer = [&](std::vector<std::vector<double>>& dst, size_t n) {
    dst.clear();
    for (int l = 0; l < m.layers; ++l) dst.push_back(read(n));
  };
  const size_t qd = size_t(m.heads) * m.head_dim, kvd = size_t(m.kv_heads) * m.head_dim;
  m.emb = read(size_t(m.vocab) * m.dim);
  per_layer(m.rms_att, m.dim);
  per_layer(m.wq, qd * m.dim);
  per_layer(m.wk, kvd * m.dim);
  per_layer(m.wv, kvd * m.dim);
  per_layer(m.wo, m.dim * qd);
  per_layer(m.rms_ffn, m.dim);
  per_layer(m.w1, size_t(m.hidden) * m.dim);
  per_layer(m.w2, size_t(m.dim) * m.hidden);
  per_layer(m.w3, size_t(m.hidden) * m.dim);
  m.rms_final = read(m.dim);
  read(size_t(m.seq_len) * m.head_dim);  // freq_cis real + imag (seq_len * head_dim/2 each)
  m.wcls = m.tied ? m.emb : read(size_t(m.vocab) * m.dim);
  std::fclose(f);
  return true;
}

RopeBand rope_band(const RefModel& m, int pair, double* keep) {
  const double pi = 3.14159265358979323846;
  const double wavelength = 2 * pi * std::pow(m.theta, 2.0 * pair / m.head_dim);
  RopeBand band = RopeBand::blended;
  double w = (m.original_ctx / wavelength - m.low_freq) / (m.high_freq - m.low_freq);
  if (wavelength < m.original_ctx / m.high_freq) {
    band = RopeBand::kept, w = 1;
  } else if (wavelength > m.original_ctx / m.low_freq) {
    band = RopeBand::slowed, w = 0;
  }
  if (keep) *keep = w;
  return band;
}

namespace {

std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x, int out) {
  const size_t in = x.size();
  std::vector<double> y(out, 0.0);
  for (int o = 0; o < out; ++o)
    for (size_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// The rotation angle of pair i at position pos.
double rope_angle(const RefModel& m, int pos, int i) {
  const double f = std::pow(m.theta, -2.0 * i / m.head_dim);
  switch (m.scaling) {
    case RefModel::Scaling::none:
      return pos * f;
    case RefModel::Scaling::linear:
      return (pos / m.scale_factor) * f;
    case RefModel::Scaling::llama3: {
      double keep = 1;
      rope_band(m, i, &keep);
      return pos * (keep * f + (1 - keep) * f / m.scale_factor);
    }
  }
  return NAN;
}

void rotate(const RefModel& m, std::vector<double>& v, int n_heads, int pos) {
  const int D = m.head_dim;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < D / 2; ++i) {
      const double a = rope_angle(m, pos, i), c = std::cos(a), s = std::sin(a);
      const int i0 = m.interleaved ? h * D + 2 * i : h * D + i;
      const int i1 = m.interleaved ? i0 + 1 : i0 + D / 2;
      const double x0 = v[i0], x1 = v[i1];
      v[i0] = x0 * c - x1 * s;
      v[i1] = x0 * s + x1 * c;
    }
}

}  // namespace

std::vector<std::vector<double>> forward_all(const RefModel& m, const std::vector<int>& tokens) {
  const int T = int(tokens.size()), D = m.head_dim, qd = m.heads * D, kvd = m.kv_heads * D;
  std::vector<std::vector<double>> x(T);
  for (int t = 0; t < T; ++t) x[t].assign(m.emb.begin() + size_t(tokens[t]) * m.dim, m.emb.begin() + size_t(tokens[t] + 1) * m.dim);
  for (int l = 0; l < m.layers; ++l) {
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const std::vector<double> xn = rmsnorm(x[t], m.rms_att[l], m.eps);
      q[t] = matvec(m.wq[l], xn, qd);
      k[t] = matvec(m.wk[l], xn, kvd);
      v[t] = matvec(m.wv[l], xn, kvd);
      rotate(m, q[t], m.heads, t);
      rotate(m, k[t], m.kv_heads, t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(qd, 0.0);
      for (int h = 0; h < m.heads; ++h) {
        const int kh = h / (m.heads / m.kv_heads);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[t][h * D + d] * k[j][kh * D + d];
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += e = std::exp(e - mx);
        for (int j = 0; j <= t; ++j)
          for (int d = 0; d < D; ++d) att[h * D + d] += s[j] / z * v[j][kh * D + d];
      }
      const std::vector<double> o = matvec(m.wo[l], att, m.dim);
      for (int i = 0; i < m.dim; ++i) x[t][i] += o[i];
      const std::vector<double> xn = rmsnorm(x[t], m.rms_ffn[l], m.eps);
      const std::vector<double> g = matvec(m.w1[l], xn, m.hidden), u = matvec(m.w3[l], xn, m.hidden);
      std::vector<double> hb(m.hidden);
      for (int i = 0; i < m.hidden; ++i) hb[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const std::vector<double> y = matvec(m.w2[l], hb, m.dim);
      for (int i = 0; i < m.dim; ++i) x[t][i] += y[i];
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int t = 0; t < T; ++t) logits[t] = matvec(m.wcls, rmsnorm(x[t], m.rms_final, m.eps), m.vocab);
  return logits;
}

std::vector<int> greedy(const RefModel& m, const std::vector<int>& prompt, int steps, double* min_margin) {
  std::vector<int> seq = prompt, out;
  double margin = 1e300;
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> last = forward_all(m, seq).back();  // quadratic, fine for the tiny models
    int best = 0;
    for (int i = 1; i < m.vocab; ++i)
      if (last[i] > last[best]) best = i;
    double second = -1e300;
    for (int i = 0; i < m.vocab; ++i)
      if (i != best) second = std::max(second, last[i]);
    margin = std::min(margin, last[best] - second);
    out.push_back(best);
    seq.push_back(best);
  }
  if (min_margin) *min_margin = margin;
  return out;
}

}  // namespace reftest
