// llama2.c checkpoints. Legacy (version 0): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len; a negative vocab_size means a separate classifier follows), then fp32 tensors in the order
// embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real, freq_cis_imag [, wcls].
// Version 1: magic "ak42", version 1, the same 7 ints, a shared-classifier byte, zero padding to 256 bytes, then
// rms_att, rms_ffn, rms_final, embedding, wq, wk, wv, wo, w1, w2, w3 [, wcls] (no RoPE tables).
#include <cstdint>
#include <cstring>

#include "engine/errors.h"
#include "engine/mapped_file.h"
#include "engine/weights.h"

namespace flashlite::engine {

namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42" read as a little-endian uint32

struct Reader {
  const MappedFile& file;
  size_t offset;
  // Copies `n` floats into dst (rows of a fused matrix land at dst + row offsets chosen by the caller). The file
  // size was checked against the header, so the bound check is a second line of defence, not the validation.
  void floats(float* dst, size_t n) {
    check(n);
    std::memcpy(dst, file.data() + offset, n * 4);
    offset += n * 4;
  }
  void skip(size_t n) {
    check(n);
    offset += n * 4;
  }
  void check(size_t n) const {
    if (n > (file.size() - offset) / 4) fail_runtime("llama2.c checkpoint '" + file.path() + "': read past the end");
  }
};

}  // namespace

ModelWeights load_llama2c_checkpoint(const std::string& path) {
  MappedFile file(path);
  const std::string where = "llama2.c checkpoint '" + path + "'";
  if (file.size() < 28) fail(where + " is " + std::to_string(file.size()) + " bytes; expected at least a 28-byte header");
  uint32_t magic;
  std::memcpy(&magic, file.data(), 4);
  int version = 0;
  int32_t raw[7];
  bool shared = false;
  size_t offset = 28;
  if (magic == kMagic) {
    int32_t v;
    std::memcpy(&v, file.data() + 4, 4);
    if (v != 1) fail(where + " has format version " + std::to_string(v) + "; expected 0 (legacy) or 1 (fp32); int8 (2) is unsupported");
    if (file.size() < 256) fail(where + " is shorter than its 256-byte version-1 header");
    version = 1;
    std::memcpy(raw, file.data() + 8, 28);
    shared = file.data()[36] != 0;
    offset = 256;
  } else {
    std::memcpy(raw, file.data(), 28);
  }
  int64_t h[7];  // wide: the legacy format negates vocab_size, and -INT32_MIN does not fit an int32
  for (int i = 0; i < 7; ++i) h[i] = raw[i];
  if (version == 0) {
    shared = h[5] > 0;
    h[5] = h[5] < 0 ? -h[5] : h[5];
  }
  // Sanity bounds first: a random file must not make us compute a huge size (validate() then applies the limits).
  static const char* const kFields[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    if (h[i] <= 0 || h[i] > (1 << 24)) {
      fail(where + " has header field " + std::to_string(i) + " = " + std::to_string(h[i]) + " (" + kFields[i] +
           "); expected a positive size of at most 2^24 (is this a llama2.c checkpoint?)");
    }
  }
  ModelConfig c;
  c.source = "llama2c";
  c.rope_style = RopeStyle::interleaved;
  c.dim = int(h[0]);
  c.hidden_dim = int(h[1]);
  c.n_layers = int(h[2]);
  c.n_heads = int(h[3]);
  c.n_kv_heads = int(h[4]);
  c.vocab_size = int(h[5]);
  c.max_seq_len = int(h[6]);
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0;
  c.tie_embeddings = shared;
  c.bos_id = 1;
  c.eos_ids = {1, 2};  // llama2.c models delimit stories with BOS; EOS also ends a sequence
  c.dtype = "float32";
  if (c.dim % c.n_heads != 0) {
    fail(where + ": dim " + std::to_string(c.dim) + " is not divisible by n_heads " + std::to_string(c.n_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  c.validate(where);

  const size_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers, qd = c.q_dim(), kvd = c.kv_dim(), vocab = c.vocab_size;
  const size_t rope_tables = version == 0 ? 2 * size_t(c.max_seq_len) * (c.head_dim / 2) : 0;
  // Checked: a wrapped total could equal the file size and pass the comparison below.
  const std::string what = where + ": the size its header implies (" + c.summary() + ")";
  const CheckedSize V(vocab, what), D(dim, what);
  const CheckedSize layer = D * 2 + D * qd + D * kvd * 2 + D * qd + D * hid * 3;
  const CheckedSize floats = V * dim + layer * L + dim + rope_tables + (shared ? uint64_t(0) : (V * dim).value());
  const uint64_t expected = (floats * 4 + offset).value();
  if (file.size() != expected) {
    fail(where + " is " + std::to_string(file.size()) + " bytes; its header (" + c.summary() + ") implies " +
         std::to_string(expected) + (file.size() < expected ? " (truncated)" : " (trailing bytes)"));
  }

  ModelWeights w;
  w.config = c;
  layout_weights(w);
  Reader r{file, offset};
  auto per_layer = [&](auto member, size_t rows_offset, size_t n) {
    for (LayerWeights& l : w.layers) r.floats(writable(l.*member) + rows_offset, n);
  };
  if (version == 0) r.floats(writable(w.embedding), vocab * dim);
  per_layer(&LayerWeights::rms_att, 0, dim);
  if (version == 1) {
    per_layer(&LayerWeights::rms_ffn, 0, dim);
    r.floats(writable(w.rms_final), dim);
    r.floats(writable(w.embedding), vocab * dim);
  }
  per_layer(&LayerWeights::wqkv, 0, qd * dim);
  per_layer(&LayerWeights::wqkv, qd * dim, kvd * dim);
  per_layer(&LayerWeights::wqkv, (qd + kvd) * dim, kvd * dim);
  per_layer(&LayerWeights::wo, 0, dim * qd);
  if (version == 0) per_layer(&LayerWeights::rms_ffn, 0, dim);
  per_layer(&LayerWeights::w13, 0, hid * dim);
  per_layer(&LayerWeights::w2, 0, dim * hid);
  per_layer(&LayerWeights::w13, hid * dim, hid * dim);
  if (version == 0) {
    r.floats(writable(w.rms_final), dim);
    r.skip(rope_tables);  // recomputed in float64 from theta; the stored tables agree to ~2e-6
  }
  if (!shared) r.floats(writable(w.lm_head), vocab * dim);
  return w;
}

}  // namespace flashlite::engine
