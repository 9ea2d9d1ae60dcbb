#include "engine/weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>

#include "engine/errors.h"
#include "engine/mapped_file.h"

namespace flashlite::engine {

void FloatArena::allocate(size_t n) {
  const std::string what = "a weight arena of " + std::to_string(n) + " floats";
  const size_t bytes = (CheckedSize(n, what) * sizeof(float)).round_up(64).value();
  void* p = bytes ? std::aligned_alloc(64, bytes) : nullptr;
  if (bytes && !p) fail_runtime("cannot allocate " + std::to_string(bytes) + " bytes for the model weights");
  // Zeroed in parallel: an 8B model's fp32 arena is 32 GB of first-touch page faults.
  constexpr size_t kChunk = size_t(64) << 20;
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t off = size_t(c) * kChunk;
    std::memset(static_cast<char*>(p) + off, 0, std::min(kChunk, bytes - off));
  }
  data = std::unique_ptr<float[], void (*)(float*)>(static_cast<float*>(p), [](float* q) { std::free(q); });
  size = n;
}

size_t ModelWeights::parameter_count() const { return engine::parameter_count(config); }

size_t parameter_count(const ModelConfig& c) {
  const size_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), vocab = c.vocab_size;
  return vocab * dim * (c.tie_embeddings ? 1 : 2) + dim +
         size_t(c.n_layers) * (2 * dim + (qd + 2 * kvd) * dim + dim * qd + 3 * hid * dim);
}

TensorShard TensorShard::of(const ModelConfig& c, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    fail("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " does not exist");
  }
  if (c.n_kv_heads % ranks != 0) {
    fail("tensor parallelism over " + std::to_string(ranks) + " ranks needs the KV heads to divide among them; the model has " +
         std::to_string(c.n_kv_heads) + " (num_key_value_heads)");
  }
  auto range = [&](int n, const char* what, int& begin, int& count) {  // contiguous, sizes differing by at most one
    if (n < ranks) fail("tensor parallelism over " + std::to_string(ranks) + " ranks: the model's " + what + " (" + std::to_string(n) + ") is smaller");
    begin = int(int64_t(n) * rank / ranks);
    count = int(int64_t(n) * (rank + 1) / ranks) - begin;
  };
  TensorShard s;
  s.rank = rank;
  s.ranks = ranks;
  s.kv_heads = c.n_kv_heads / ranks;
  s.kv_head0 = rank * s.kv_heads;
  s.heads = c.n_heads / ranks;  // n_heads is a multiple of n_kv_heads (validate), so of ranks too
  s.head0 = rank * s.heads;
  range(c.hidden_dim, "intermediate_size", s.hidden0, s.hidden);
  range(c.vocab_size, "vocab_size", s.vocab0, s.vocab);
  return s;
}

void TensorShard::require_ranks(int model_ranks) const {
  if (model_ranks != ranks) {
    fail("the weights are tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
         " but the model has " + std::to_string(model_ranks) + " rank(s)");
  }
}

ModelConfig ModelWeights::rank_config() const {
  ModelConfig c = config;
  if (shard.ranks <= 1) return c;
  c.n_heads = shard.heads;
  c.n_kv_heads = shard.kv_heads;
  c.hidden_dim = shard.hidden;
  c.vocab_size = shard.vocab;
  c.tie_embeddings = false;  // the rank's LM head is its own slice of the embedding
  return c;
}

void layout_weights(ModelWeights& w) {
  const ModelConfig& full = w.config;
  // The sizes come from a file: validate() bounds every field, and the arithmetic is checked anyway, so no config
  // can wrap the total to a small arena that the loaders then write past.
  full.validate("the model config (" + full.source + ")");
  if (w.shard.heads == 0) w.shard = TensorShard::of(full, 0, 1);
  const ModelConfig c = w.rank_config();
  const std::string what = "the weight arena of " + full.summary();
  const CheckedSize dim(c.dim, what), hid(c.hidden_dim, what), qd(c.q_dim(), what), kvd(c.kv_dim(), what);
  const CheckedSize vocab(full.vocab_size, what), head_rows(c.vocab_size, what);
  // Keep every tensor 16-float (64-byte) aligned so SIMD loads of row starts are aligned when rows are.
  auto pad = [](const CheckedSize& n) { return n.round_up(16); };
  const CheckedSize per_layer =
      pad(dim) + pad((qd + kvd * 2) * dim) + pad(dim * qd) + pad(dim) + pad(hid * dim * 2) + pad(dim * hid);
  const CheckedSize total = pad(vocab * dim) + per_layer * uint64_t(c.n_layers) + pad(dim) +
                            (c.tie_embeddings ? uint64_t(0) : pad(head_rows * dim).value());
  w.arena.allocate(total.value());
  float* p = w.arena.data.get();
  // Sizes below are the ones summed above, so they fit.
  auto take = [&](size_t n) {
    float* r = p;
    p += (n + 15) / 16 * 16;
    return r;
  };
  const size_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  w.embedding = take(size_t(full.vocab_size) * d);
  w.layers.assign(c.n_layers, LayerWeights{});
  for (LayerWeights& l : w.layers) {
    l.rms_att = take(d);
    l.wqkv = take((q + 2 * kv) * d);
    l.wo = take(d * q);
    l.rms_ffn = take(d);
    l.w13 = take(2 * h * d);
    l.w2 = take(d * h);
  }
  w.rms_final = take(d);
  w.lm_head = c.tie_embeddings ? w.embedding : take(size_t(c.vocab_size) * d);
}

std::vector<TensorSlot> tensor_slots(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const TensorShard& sh = w.shard.heads ? w.shard : TensorShard::of(c, 0, 1);
  const ExpectedDim dim{c.dim, "hidden_size"}, hid{c.hidden_dim, "intermediate_size"}, vocab{c.vocab_size, "vocab_size"};
  const ExpectedDim qd{c.q_dim(), "num_attention_heads*head_dim"}, kvd{c.kv_dim(), "num_key_value_heads*head_dim"};
  const int64_t d = c.dim, D = c.head_dim;
  const int64_t q = int64_t(sh.heads) * D, kv = int64_t(sh.kv_heads) * D, h = sh.hidden;  // this rank's widths
  const bool laid_out = w.arena.data != nullptr;
  std::vector<TensorSlot> slots;
  auto add = [&](std::string name, std::vector<ExpectedDim> shape, TensorBlock b, const float* base, int64_t offset) {
    slots.push_back({std::move(name), std::move(shape), b, laid_out ? writable(base) + offset : nullptr});
  };
  auto rows = [&](int64_t r0, int64_t n, int64_t cols) { return TensorBlock{r0, n, 0, cols}; };
  auto cols = [&](int64_t c0, int64_t n, int64_t rows_) { return TensorBlock{0, rows_, c0, n}; };
  const TensorBlock vec{0, 1, 0, d};
  add("model.embed_tokens.weight", {vocab, dim}, rows(0, c.vocab_size, d), w.embedding, 0);
  const LayerWeights none;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const LayerWeights& l = laid_out ? w.layers[i] : none;
    add(p + "input_layernorm.weight", {dim}, vec, l.rms_att, 0);
    add(p + "self_attn.q_proj.weight", {qd, dim}, rows(sh.head0 * D, q, d), l.wqkv, 0);
    add(p + "self_attn.k_proj.weight", {kvd, dim}, rows(sh.kv_head0 * D, kv, d), l.wqkv, q * d);
    add(p + "self_attn.v_proj.weight", {kvd, dim}, rows(sh.kv_head0 * D, kv, d), l.wqkv, (q + kv) * d);
    add(p + "self_attn.o_proj.weight", {dim, qd}, cols(sh.head0 * D, q, d), l.wo, 0);
    add(p + "post_attention_layernorm.weight", {dim}, vec, l.rms_ffn, 0);
    add(p + "mlp.gate_proj.weight", {hid, dim}, rows(sh.hidden0, h, d), l.w13, 0);
    add(p + "mlp.up_proj.weight", {hid, dim}, rows(sh.hidden0, h, d), l.w13, h * d);
    add(p + "mlp.down_proj.weight", {dim, hid}, cols(sh.hidden0, h, d), l.w2, 0);
  }
  add("model.norm.weight", {dim}, vec, w.rms_final, 0);
  const bool whole_tied = c.tie_embeddings && sh.ranks == 1;  // lm_head is the embedding itself
  if (!whole_tied) {
    add(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", {vocab, dim}, rows(sh.vocab0, sh.vocab, d),
        w.lm_head, 0);
  }
  return slots;
}

ModelWeights slice_weights(const ModelWeights& whole, int rank, int ranks) {
  if (whole.shard.ranks != 1) fail("slice_weights needs a whole model; got rank " + std::to_string(whole.shard.rank) + " of " + std::to_string(whole.shard.ranks));
  ModelWeights part;
  part.config = whole.config;
  part.shard = TensorShard::of(whole.config, rank, ranks);
  layout_weights(part);
  std::map<std::string, const TensorSlot*> from;
  const std::vector<TensorSlot> src = tensor_slots(whole), dst = tensor_slots(part);
  for (const TensorSlot& t : src) from.emplace(t.name, &t);  // the first: the embedding's own slot when tied
  for (const TensorSlot& t : dst) {
    const TensorSlot& s = *from.at(t.name);
    const int64_t width = s.block.cols;  // the whole tensor's row length
    for (int64_t r = 0; r < t.block.rows; ++r) {
      std::copy_n(s.dst + (t.block.row0 + r) * width + t.block.col0, t.block.cols, t.dst + r * t.block.cols);
    }
  }
  return part;
}

ModelConfig load_checkpoint_config(const std::string& path) {
  if (!is_directory(path)) return load_checkpoint(path).config;
  ModelConfig c = load_hf_config(path);
  tie_if_head_missing(c, SafetensorsCheckpoint(path));
  return c;
}

ModelWeights load_checkpoint(const std::string& path, const LoadProgress& progress, int rank, int ranks) {
  if (is_directory(path)) return load_hf_checkpoint(path, progress, rank, ranks);
  if (file_exists(path)) return ranks == 1 ? load_llama2c_checkpoint(path) : slice_weights(load_llama2c_checkpoint(path), rank, ranks);
  fail("model path '" + path + "' does not exist; expected a Hugging Face checkpoint directory or a llama2.c .bin file");
}

}  // namespace flashlite::engine
