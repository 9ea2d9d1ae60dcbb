#include "engine/llama_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu/kernels.h"
#include "engine/errors.h"

namespace flashlite::engine {

LlamaCpu::LlamaCpu(const ModelWeights& weights, const RuntimeOptions& options) : w_(weights), opt_(options) {
  const ModelConfig& c = w_.config;
  const int context = opt_.context > 0 ? opt_.context : c.max_seq_len;
  if (context > c.max_seq_len) {
    fail("context " + std::to_string(context) + " exceeds the model's maximum of " + std::to_string(c.max_seq_len) + " positions");
  }
  if (opt_.slots < 1) fail("batch (slots) is " + std::to_string(opt_.slots) + "; expected at least 1");
  threads_ = opt_.threads > 0 ? opt_.threads : (w_.parameter_count() < 5'000'000 ? 1 : omp_get_num_procs());
  omp_set_num_threads(threads_);  // flashlite's CPU attention uses the same OpenMP pool
  cache_ = KvCache({c.n_layers, opt_.slots, context, c.n_kv_heads, c.head_dim});
  // RoPE tables in float64, rounded once: cos/sin(pos * inv_freq[i]).
  const std::vector<double> inv = rope_inv_freq(c);
  const int half = c.head_dim / 2;
  cos_.resize(size_t(context) * half);
  sin_.resize(size_t(context) * half);
  for (int p = 0; p < context; ++p)
    for (int i = 0; i < half; ++i) {
      cos_[size_t(p) * half + i] = float(std::cos(p * inv[i]));
      sin_[size_t(p) * half + i] = float(std::sin(p * inv[i]));
    }
}

void LlamaCpu::ensure_scratch(int rows, int logit_rows) {
  const ModelConfig& c = w_.config;
  auto grow = [](std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(x_, size_t(rows) * c.dim);
  grow(xb_, size_t(rows) * c.dim);
  grow(qkv_, size_t(rows) * (c.q_dim() + 2 * c.kv_dim()));
  grow(att_, size_t(rows) * c.q_dim());
  grow(h13_, size_t(rows) * 2 * c.hidden_dim);
  grow(hb_, size_t(rows) * c.hidden_dim);
  grow(xo_, size_t(rows) * c.dim);
  logits_.resize(size_t(logit_rows) * c.vocab_size);
}

// Rotates q and k of every row in place. Interleaved (llama2.c) pairs (2i, 2i+1); half-split (HF) pairs (i, i+D/2).
void LlamaCpu::rope_rows(float* qkv, const std::vector<int>& positions, int rows) {
  const ModelConfig& c = w_.config;
  const int D = c.head_dim, half = D / 2, heads = c.n_heads + c.n_kv_heads;
  const int64_t stride = c.q_dim() + 2 * c.kv_dim();
  const bool interleaved = c.rope_style == RopeStyle::interleaved;
  for (int r = 0; r < rows; ++r) {
    const float* cs = cos_.data() + size_t(positions[r]) * half;
    const float* sn = sin_.data() + size_t(positions[r]) * half;
    for (int h = 0; h < heads; ++h) {  // q heads then k heads: contiguous in the fused row
      float* v = qkv + r * stride + h * D;
      for (int i = 0; i < half; ++i) {
        float* a = interleaved ? v + 2 * i : v + i;
        float* b = interleaved ? v + 2 * i + 1 : v + i + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * cs[i] - x1 * sn[i];
        *b = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

const std::vector<float>& LlamaCpu::forward(const std::vector<SequenceInput>& inputs) {
  const ModelConfig& c = w_.config;
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, D = c.head_dim;
  const int qkv_w = qd + 2 * kvd;
  // Rows: every new token of every input, in order. Validate before touching the cache.
  int rows = 0, logit_rows = 0;
  std::vector<int> row0;  // first row of each input
  for (const SequenceInput& in : inputs) {
    if (in.slot < 0 || in.slot >= cache_.shape().slots) {
      fail("slot " + std::to_string(in.slot) + " is outside [0, " + std::to_string(cache_.shape().slots) + ")");
    }
    const int n = int(in.tokens.size());
    if (n == 0) fail("an input sequence has no new tokens");
    const int len = cache_.length(in.slot);
    if (len + n > context()) {
      fail("sequence would reach " + std::to_string(len + n) + " tokens (" + std::to_string(len) + " cached + " +
           std::to_string(n) + " new); the context holds " + std::to_string(context()));
    }
    for (int t : in.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        fail("token id " + std::to_string(t) + " is outside the model's vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
    }
    for (size_t j = 0; j < inputs.size() && &inputs[j] != &in; ++j) {
      if (inputs[j].slot == in.slot) fail("slot " + std::to_string(in.slot) + " appears twice in one forward call");
    }
    row0.push_back(rows);
    rows += n;
    logit_rows += in.all_logits ? n : 1;
  }
  ensure_scratch(rows, logit_rows);
  std::vector<int> positions(rows);
  for (size_t s = 0; s < inputs.size(); ++s) {
    const int len = cache_.length(inputs[s].slot);
    for (size_t i = 0; i < inputs[s].tokens.size(); ++i) {
      positions[row0[s] + i] = len + int(i);
      std::copy_n(w_.embedding + size_t(inputs[s].tokens[i]) * dim, dim, x_.data() + size_t(row0[s] + i) * dim);
    }
  }

  auto mm = [&](float* y, const float* x, const float* w, int in, int out, int ldx, int ldy) {
    cpu::matmul({y, x, w, rows, in, out, ldx, ldy, threads_});
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    for (int r = 0; r < rows; ++r) cpu::rmsnorm(&xb_[size_t(r) * dim], &x_[size_t(r) * dim], L.rms_att, dim, c.rms_eps);
    mm(qkv_.data(), xb_.data(), L.wqkv, dim, qkv_w, dim, qkv_w);
    rope_rows(qkv_.data(), positions, rows);
    // Append K and V of the new rows to each sequence's cache, then attend over the cached prefix.
    for (size_t s = 0; s < inputs.size(); ++s) {
      const int slot = inputs[s].slot, n = int(inputs[s].tokens.size()), len = cache_.length(slot);
      for (int i = 0; i < n; ++i) {
        const float* row = &qkv_[size_t(row0[s] + i) * qkv_w];
        std::copy_n(row + qd, kvd, cache_.k(l, slot, len + i));
        std::copy_n(row + qd + kvd, kvd, cache_.v(l, slot, len + i));
      }
      ForwardArgs a;
      a.q = TensorView::strided(&qkv_[size_t(row0[s]) * qkv_w], DType::f32, Device::cpu(), {1, n, c.n_heads, D},
                                {int64_t(n) * qkv_w, qkv_w, D, 1});
      a.k = cache_.k_view(l, slot, len + n);
      a.v = cache_.v_view(l, slot, len + n);
      a.out = TensorView::strided(&att_[size_t(row0[s]) * qd], DType::f32, Device::cpu(), {1, n, c.n_heads, D},
                                  {int64_t(n) * qd, qd, D, 1});
      a.options.causal = true;  // bottom-right: new row i sees cached keys [0, len + i]
      a.backend = opt_.attention == Backend::automatic ? Backend::cpu : opt_.attention;
      flashlite::forward(a);
    }
    mm(xo_.data(), att_.data(), L.wo, qd, dim, qd, dim);
    for (size_t i = 0; i < size_t(rows) * dim; ++i) x_[i] += xo_[i];
    for (int r = 0; r < rows; ++r) cpu::rmsnorm(&xb_[size_t(r) * dim], &x_[size_t(r) * dim], L.rms_ffn, dim, c.rms_eps);
    mm(h13_.data(), xb_.data(), L.w13, dim, 2 * hid, dim, 2 * hid);
    for (int r = 0; r < rows; ++r) cpu::swiglu(&hb_[size_t(r) * hid], &h13_[size_t(r) * 2 * hid], &h13_[size_t(r) * 2 * hid + hid], hid);
    mm(xo_.data(), hb_.data(), L.w2, hid, dim, hid, dim);
    for (size_t i = 0; i < size_t(rows) * dim; ++i) x_[i] += xo_[i];
  }
  for (size_t s = 0; s < inputs.size(); ++s) {
    const int slot = inputs[s].slot;
    cache_.set_length(slot, cache_.length(slot) + int(inputs[s].tokens.size()));
  }

  // Final norm of the rows that need logits, gathered contiguously, then one LM-head matmul.
  int lr = 0;
  for (size_t s = 0; s < inputs.size(); ++s) {
    const int n = int(inputs[s].tokens.size());
    for (int i = inputs[s].all_logits ? 0 : n - 1; i < n; ++i, ++lr) {
      cpu::rmsnorm(&xb_[size_t(lr) * dim], &x_[size_t(row0[s] + i) * dim], w_.rms_final, dim, c.rms_eps);
    }
  }
  cpu::matmul({logits_.data(), xb_.data(), w_.lm_head, logit_rows, dim, c.vocab_size, dim, c.vocab_size, threads_});
  return logits_;
}

}  // namespace flashlite::engine

namespace flashlite::engine {

std::string LlamaCpu::attention_kernel() {
  const ModelConfig& c = w_.config;
  std::vector<float> q(size_t(c.q_dim())), o(size_t(c.q_dim()));
  ForwardArgs a;
  a.q = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {1, 1, c.n_heads, c.head_dim});
  a.k = cache_.k_view(0, 0, 1);
  a.v = cache_.v_view(0, 0, 1);
  a.out = TensorView::contiguous(o.data(), DType::f32, Device::cpu(), {1, 1, c.n_heads, c.head_dim});
  a.options.causal = true;
  a.backend = opt_.attention == Backend::automatic ? Backend::cpu : opt_.attention;
  return forward_kernel_name(a);
}

}  // namespace flashlite::engine
