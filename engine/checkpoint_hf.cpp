// Hugging Face Llama checkpoints: config.json + model.safetensors (or shards), converted to the fp32 CPU layout.
#include <string>

#include "engine/errors.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace flashlite::engine {

ModelWeights load_hf_checkpoint(const std::string& dir, const LoadProgress& progress) {
  ModelWeights w;
  w.config = load_hf_config(dir);
  const ModelConfig& c = w.config;
  SafetensorsCheckpoint ckpt(dir);
  // Some exports keep lm_head even when tied; others omit it without saying tie_word_embeddings.
  if (!c.tie_embeddings && !ckpt.has("lm_head.weight")) w.config.tie_embeddings = true;
  layout_weights(w);
  const int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), vocab = c.vocab_size;
  ckpt.read_f32("model.embed_tokens.weight", {vocab, dim}, writable(w.embedding));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    ckpt.read_f32(p + "input_layernorm.weight", {dim}, writable(l.rms_att));
    ckpt.read_f32(p + "self_attn.q_proj.weight", {qd, dim}, writable(l.wqkv));
    ckpt.read_f32(p + "self_attn.k_proj.weight", {kvd, dim}, writable(l.wqkv) + qd * dim);
    ckpt.read_f32(p + "self_attn.v_proj.weight", {kvd, dim}, writable(l.wqkv) + (qd + kvd) * dim);
    ckpt.read_f32(p + "self_attn.o_proj.weight", {dim, qd}, writable(l.wo));
    ckpt.read_f32(p + "post_attention_layernorm.weight", {dim}, writable(l.rms_ffn));
    ckpt.read_f32(p + "mlp.gate_proj.weight", {hid, dim}, writable(l.w13));
    ckpt.read_f32(p + "mlp.up_proj.weight", {hid, dim}, writable(l.w13) + hid * dim);
    ckpt.read_f32(p + "mlp.down_proj.weight", {dim, hid}, writable(l.w2));
    // Only worth showing for checkpoints of a few hundred MB and more.
    if (progress && ckpt.total_bytes() > (256u << 20)) progress(i + 1, c.n_layers);
  }
  ckpt.read_f32("model.norm.weight", {dim}, writable(w.rms_final));
  if (!w.config.tie_embeddings) ckpt.read_f32("lm_head.weight", {vocab, dim}, writable(w.lm_head));
  return w;
}

}  // namespace flashlite::engine
