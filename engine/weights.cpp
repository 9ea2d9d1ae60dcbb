#include "engine/weights.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/errors.h"
#include "engine/mapped_file.h"

namespace flashlite::engine {

void FloatArena::allocate(size_t n) {
  const std::string what = "a weight arena of " + std::to_string(n) + " floats";
  const size_t bytes = (CheckedSize(n, what) * sizeof(float)).round_up(64).value();
  void* p = bytes ? std::aligned_alloc(64, bytes) : nullptr;
  if (bytes && !p) fail_runtime("cannot allocate " + std::to_string(bytes) + " bytes for the model weights");
  if (p) std::memset(p, 0, bytes);
  data = std::unique_ptr<float[], void (*)(float*)>(static_cast<float*>(p), [](float* q) { std::free(q); });
  size = n;
}

size_t ModelWeights::parameter_count() const {
  const ModelConfig& c = config;
  const size_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), vocab = c.vocab_size;
  return vocab * dim * (c.tie_embeddings ? 1 : 2) + dim +
         size_t(c.n_layers) * (2 * dim + (qd + 2 * kvd) * dim + dim * qd + 3 * hid * dim);
}

void layout_weights(ModelWeights& w) {
  const ModelConfig& c = w.config;
  // The sizes come from a file: validate() bounds every field, and the arithmetic is checked anyway, so no config
  // can wrap the total to a small arena that the loaders then write past.
  c.validate("the model config (" + c.source + ")");
  const std::string what = "the weight arena of " + c.summary();
  const CheckedSize dim(c.dim, what), hid(c.hidden_dim, what), qd(c.q_dim(), what), kvd(c.kv_dim(), what);
  const CheckedSize vocab(c.vocab_size, what);
  // Keep every tensor 16-float (64-byte) aligned so SIMD loads of row starts are aligned when rows are.
  auto pad = [](const CheckedSize& n) { return n.round_up(16); };
  const CheckedSize per_layer =
      pad(dim) + pad((qd + kvd * 2) * dim) + pad(dim * qd) + pad(dim) + pad(hid * dim * 2) + pad(dim * hid);
  const CheckedSize total = pad(vocab * dim) + per_layer * uint64_t(c.n_layers) + pad(dim) +
                            (c.tie_embeddings ? uint64_t(0) : pad(vocab * dim).value());
  w.arena.allocate(total.value());
  float* p = w.arena.data.get();
  // Sizes below are the ones summed above, so they fit.
  auto take = [&](size_t n) {
    float* r = p;
    p += (n + 15) / 16 * 16;
    return r;
  };
  const size_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), v = c.vocab_size;
  w.embedding = take(v * d);
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
  w.lm_head = c.tie_embeddings ? w.embedding : take(v * d);
}

ModelWeights load_checkpoint(const std::string& path, const LoadProgress& progress) {
  if (is_directory(path)) return load_hf_checkpoint(path, progress);
  if (file_exists(path)) return load_llama2c_checkpoint(path);
  fail("model path '" + path + "' does not exist; expected a Hugging Face checkpoint directory or a llama2.c .bin file");
}

}  // namespace flashlite::engine
