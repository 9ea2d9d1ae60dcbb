#include "engine/weights.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/errors.h"
#include "engine/mapped_file.h"

namespace flashlite::engine {

void FloatArena::allocate(size_t n) {
  const size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
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
  const size_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), vocab = c.vocab_size;
  // Keep every tensor 16-float (64-byte) aligned so SIMD loads of row starts are aligned when rows are.
  auto pad = [](size_t n) { return (n + 15) / 16 * 16; };
  const size_t per_layer = pad(dim) + pad((qd + 2 * kvd) * dim) + pad(dim * qd) + pad(dim) + pad(2 * hid * dim) + pad(dim * hid);
  size_t total = pad(vocab * dim) + per_layer * c.n_layers + pad(dim) + (c.tie_embeddings ? 0 : pad(vocab * dim));
  w.arena.allocate(total);
  float* p = w.arena.data.get();
  auto take = [&](size_t n) {
    float* r = p;
    p += pad(n);
    return r;
  };
  w.embedding = take(vocab * dim);
  w.layers.resize(c.n_layers);
  for (LayerWeights& l : w.layers) {
    l.rms_att = take(dim);
    l.wqkv = take((qd + 2 * kvd) * dim);
    l.wo = take(dim * qd);
    l.rms_ffn = take(dim);
    l.w13 = take(2 * hid * dim);
    l.w2 = take(dim * hid);
  }
  w.rms_final = take(dim);
  w.lm_head = c.tie_embeddings ? w.embedding : take(vocab * dim);
}

ModelWeights load_checkpoint(const std::string& path, const LoadProgress& progress) {
  if (is_directory(path)) return load_hf_checkpoint(path, progress);
  if (file_exists(path)) return load_llama2c_checkpoint(path);
  fail("model path '" + path + "' does not exist; expected a Hugging Face checkpoint directory or a llama2.c .bin file");
}

}  // namespace flashlite::engine
