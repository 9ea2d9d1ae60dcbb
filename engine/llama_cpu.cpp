#include "engine/llama_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu/kernels.h"
#include "engine/errors.h"

namespace flashlite::engine {

LlamaCpu::LlamaCpu(const ModelWeights& weights, const RuntimeOptions& options, Collective* collective)
    : w_(weights), c_(weights.rank_config()), opt_(options), collective_(collective) {
  const ModelConfig& c = c_;
  w_.shard.require_ranks(collective ? collective->ranks() : 1);
  const int context = opt_.context > 0 ? opt_.context : c.max_seq_len;
  if (context > c.max_seq_len) {
    fail("context " + std::to_string(context) + " exceeds the model's maximum of " + std::to_string(c.max_seq_len) + " positions");
  }
  if (opt_.slots < 1) fail("batch (slots) is " + std::to_string(opt_.slots) + "; expected at least 1");
  threads_ = opt_.threads > 0 ? opt_.threads : (w_.parameter_count() < 5'000'000 ? 1 : omp_get_num_procs());
  omp_set_num_threads(threads_);  // flashlite's CPU attention uses the same OpenMP pool
  if (opt_.kv_page_size > 0 && opt_.attention != Backend::automatic && opt_.attention != Backend::cpu) {
    fail("a paged KV cache needs the cpu attention backend (flashlite::decode / prefill read its page table)");
  }
  // Paged without a page count: enough for every slot at full context.
  const int pages = opt_.kv_page_size <= 0 ? 0
                    : opt_.kv_pages > 0    ? opt_.kv_pages
                                           : opt_.slots * ((context + opt_.kv_page_size - 1) / opt_.kv_page_size);
  cache_ = KvCache({c.n_layers, opt_.slots, context, c.n_kv_heads, c.head_dim, std::max(0, opt_.kv_page_size), pages});
  rope_ = rope_options(c);
}

void LlamaCpu::ensure_scratch(int rows, int logit_rows) {
  const ModelConfig& c = c_;
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

void LlamaCpu::attend(int layer, const KvGroup& g, int row) {
  const ModelConfig& c = c_;
  const int D = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), qkv_w = qd + 2 * kvd;
  // [count, n, heads, head_dim] views of the group's rows (sequence i's n rows follow sequence i - 1's).
  auto rows = [&](float* p, int heads, int64_t ld) {
    return TensorView::strided(p, DType::f32, Device::cpu(), {g.count, g.n, heads, D}, {g.n * ld, ld, D, 1});
  };
  float* qkv = &qkv_[size_t(row) * qkv_w];
  AppendArgs ap;
  ap.cache = cache_.view(layer, g.slot0, g.count);  // lengths already grown by this call's tokens
  ap.k = rows(qkv + qd, c.n_kv_heads, qkv_w);
  ap.v = rows(qkv + qd + kvd, c.n_kv_heads, qkv_w);
  ap.q = rows(qkv, c.n_heads, qkv_w);
  ap.q_out = ap.q;  // rotated in place
  ap.rope = rope_;
  ap.backend = Backend::cpu;
  append_kv(ap);
  const TensorView out = rows(&att_[size_t(row) * qd], c.n_heads, qd);
  if (opt_.attention == Backend::automatic || opt_.attention == Backend::cpu) {
    // Bottom-right causal: new row i of a sequence of length L sees positions [0, L - n + i].
    auto args = [&](auto a) {  // DecodeArgs or PrefillArgs
      a.q = ap.q;
      a.cache = ap.cache;
      a.out = out;
      a.options.causal = true;
      a.backend = Backend::cpu;
      return a;
    };
    if (g.n <= 8) flashlite::decode(args(DecodeArgs{}));
    else flashlite::prefill(args(PrefillArgs{}));
    return;
  }
  // --attention naive / reference: flashlite::forward over each sequence's cached rows.
  for (int i = 0; i < g.count; ++i) {
    const int len = cache_.length(g.slot0 + i);
    auto at = [&](const TensorView& t, int64_t rows_from, int64_t n) {
      TensorView s = t;
      s.data = static_cast<float*>(t.data) + i * t.strides[0] + rows_from * t.strides[1];
      s.shape[0] = 1;
      s.shape[1] = n;
      return s;
    };
    ForwardArgs a;
    a.q = at(ap.q, 0, g.n);
    a.k = at(ap.cache.k, 0, len);
    a.v = at(ap.cache.v, 0, len);
    a.out = at(out, 0, g.n);
    a.options.causal = true;
    a.backend = opt_.attention;
    flashlite::forward(a);
  }
}

const std::vector<float>& LlamaCpu::forward(const std::vector<SequenceInput>& inputs) {
  const ModelConfig& c = c_;
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
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
      if (t < 0 || t >= w_.config.vocab_size) {  // the embedding's rows (c.vocab_size: this rank's logits)
        fail("token id " + std::to_string(t) + " is outside the model's vocabulary [0, " + std::to_string(w_.config.vocab_size) + ")");
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
  for (size_t s = 0; s < inputs.size(); ++s) {
    for (size_t i = 0; i < inputs[s].tokens.size(); ++i) {
      std::copy_n(w_.embedding + size_t(inputs[s].tokens[i]) * dim, dim, x_.data() + size_t(row0[s] + i) * dim);
    }
  }

  auto mm = [&](float* y, const float* x, const float* w, int in, int out, int ldx, int ldy) {
    cpu::matmul({y, x, w, rows, in, out, ldx, ldy, threads_});
  };
  // Tensor parallelism: each rank's O / down output is a partial sum over its heads / FFN columns.
  auto all_reduce = [&](float* y, size_t n) {
    if (collective_) collective_->all_reduce_sum(y, n, DType::f32, nullptr);
  };
  // The library's order: the cache lengths include this call's tokens before the appends (restored on an error).
  // A paged cache takes the pages the new tokens need here (an Error when they are not free).
  std::vector<int> before(inputs.size());
  for (size_t s = 0; s < inputs.size(); ++s) before[s] = cache_.length(inputs[s].slot);
  const std::vector<KvGroup> groups = kv_groups(inputs);
  try {
    for (size_t s = 0; s < inputs.size(); ++s) cache_.set_length(inputs[s].slot, before[s] + int(inputs[s].tokens.size()));
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w_.layers[l];
      for (int r = 0; r < rows; ++r) cpu::rmsnorm(&xb_[size_t(r) * dim], &x_[size_t(r) * dim], L.rms_att, dim, c.rms_eps);
      mm(qkv_.data(), xb_.data(), L.wqkv, dim, qkv_w, dim, qkv_w);
      for (const KvGroup& g : groups) attend(l, g, row0[g.first]);  // q, k rotated; k, v cached; att = attention
      mm(xo_.data(), att_.data(), L.wo, qd, dim, qd, dim);
      all_reduce(xo_.data(), size_t(rows) * dim);
      for (size_t i = 0; i < size_t(rows) * dim; ++i) x_[i] += xo_[i];
      for (int r = 0; r < rows; ++r) cpu::rmsnorm(&xb_[size_t(r) * dim], &x_[size_t(r) * dim], L.rms_ffn, dim, c.rms_eps);
      mm(h13_.data(), xb_.data(), L.w13, dim, 2 * hid, dim, 2 * hid);
      for (int r = 0; r < rows; ++r) cpu::swiglu(&hb_[size_t(r) * hid], &h13_[size_t(r) * 2 * hid], &h13_[size_t(r) * 2 * hid + hid], hid);
      mm(xo_.data(), hb_.data(), L.w2, hid, dim, hid, dim);
      all_reduce(xo_.data(), size_t(rows) * dim);
      for (size_t i = 0; i < size_t(rows) * dim; ++i) x_[i] += xo_[i];
    }
  } catch (...) {
    for (size_t s = 0; s < inputs.size(); ++s) cache_.set_length(inputs[s].slot, before[s]);
    throw;
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

KvUsage LlamaCpu::kv_usage() {
  if (!cache_.paged()) return LlamaModel::kv_usage();
  return {cache_.shape().page_size, cache_.pages().total(), cache_.pages().used()};
}

std::string LlamaCpu::attention_kernel() {
  const ModelConfig& c = c_;
  std::vector<float> q(size_t(c.q_dim())), o(size_t(c.q_dim()));
  const int32_t one = 1;  // a one-token decode step of slot 0
  const KvCacheShape& s = cache_.shape();
  KvCacheView cache = cache_.view(0, 0, 1);
  cache.host.seq_lens.data = const_cast<int32_t*>(&one);
  static const int32_t one_page[2] = {0, 1}, page0 = 0;  // paged: slot 0 holding one token on page 0
  if (cache.layout == KvLayout::paged) {
    cache.host.page_indptr.data = const_cast<int32_t*>(one_page);
    cache.host.page_indices.data = const_cast<int32_t*>(&page0);
    cache.host.page_indices.shape[0] = 1;
    cache.host.last_page_len.data = const_cast<int32_t*>(&one);
  }
  DecodeArgs a;
  a.q = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {1, 1, c.n_heads, s.head_dim});
  a.cache = cache;
  a.out = TensorView::contiguous(o.data(), DType::f32, Device::cpu(), {1, 1, c.n_heads, s.head_dim});
  a.options.causal = true;
  if (opt_.attention == Backend::automatic || opt_.attention == Backend::cpu) {
    a.backend = Backend::cpu;
    return decode_kernel_name(a);
  }
  ForwardArgs f;  // --attention naive / reference
  f.q = a.q;
  f.k = cache.k;
  f.v = cache.v;
  f.k.shape[1] = f.v.shape[1] = 1;
  f.out = a.out;
  f.options.causal = true;
  f.backend = opt_.attention;
  return forward_kernel_name(f);
}

}  // namespace flashlite::engine
