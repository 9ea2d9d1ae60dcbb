// Hugging Face Llama checkpoints: config.json + model.safetensors (or shards), converted to the fp32 CPU layout.
#include <functional>
#include <set>
#include <string>

#include "engine/errors.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace flashlite::engine {

namespace {

// Every tensor the model reads, with the shape the config implies and where it lands in the arena (null before
// the arena exists). One list serves both passes: check everything, then allocate, then convert.
using TensorVisit = std::function<void(const std::string& name, const std::vector<ExpectedDim>& shape, float* dst)>;

void for_each_tensor(const ModelConfig& c, const ModelWeights* w, const TensorVisit& visit) {
  const ExpectedDim dim{c.dim, "hidden_size"}, hid{c.hidden_dim, "intermediate_size"}, vocab{c.vocab_size, "vocab_size"};
  const ExpectedDim qd{c.q_dim(), "num_attention_heads*head_dim"}, kvd{c.kv_dim(), "num_key_value_heads*head_dim"};
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim;
  auto at = [&](const float* p, int64_t offset) { return w ? writable(p) + offset : nullptr; };
  const LayerWeights none;
  visit("model.embed_tokens.weight", {vocab, dim}, at(w ? w->embedding : nullptr, 0));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const LayerWeights& l = w ? w->layers[i] : none;
    visit(p + "input_layernorm.weight", {dim}, at(l.rms_att, 0));
    visit(p + "self_attn.q_proj.weight", {qd, dim}, at(l.wqkv, 0));
    visit(p + "self_attn.k_proj.weight", {kvd, dim}, at(l.wqkv, q * d));
    visit(p + "self_attn.v_proj.weight", {kvd, dim}, at(l.wqkv, (q + kv) * d));
    visit(p + "self_attn.o_proj.weight", {dim, qd}, at(l.wo, 0));
    visit(p + "post_attention_layernorm.weight", {dim}, at(l.rms_ffn, 0));
    visit(p + "mlp.gate_proj.weight", {hid, dim}, at(l.w13, 0));
    visit(p + "mlp.up_proj.weight", {hid, dim}, at(l.w13, h * d));
    visit(p + "mlp.down_proj.weight", {dim, hid}, at(l.w2, 0));
  }
  visit("model.norm.weight", {dim}, at(w ? w->rms_final : nullptr, 0));
  if (!c.tie_embeddings) visit("lm_head.weight", {vocab, dim}, at(w ? w->lm_head : nullptr, 0));
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

ModelWeights load_hf_checkpoint(const std::string& dir, const LoadProgress& progress) {
  ModelWeights w;
  w.config = load_hf_config(dir);
  const ModelConfig& c = w.config;
  SafetensorsCheckpoint ckpt(dir);
  // Some exports keep lm_head even when tied; others omit it without saying tie_word_embeddings.
  if (!c.tie_embeddings && !ckpt.has("lm_head.weight")) w.config.tie_embeddings = true;

  // Every shape against the config before a byte is allocated: the arena is sized from config.json, so a config
  // that disagrees with the tensors (vocab_size 8M on a 512-token model) must fail here, not after gigabytes.
  std::set<std::string> used;
  for_each_tensor(c, nullptr, [&](const std::string& name, const std::vector<ExpectedDim>& shape, float*) {
    ckpt.expect(name, shape);
    used.insert(name);
  });
  // A tied export's spare lm_head, and the RoPE tables of older exports, are ignored by transformers too.
  if (c.tie_embeddings && ckpt.has("lm_head.weight")) {
    ckpt.expect("lm_head.weight", {{c.vocab_size, "vocab_size"}, {c.dim, "hidden_size"}});
    used.insert("lm_head.weight");
  }
  std::vector<std::string> unused;
  for (const std::string& name : ckpt.unused(used))
    if (!ends_with(name, ".rotary_emb.inv_freq")) unused.push_back(name);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 6; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 6) list += ", ... (" + std::to_string(unused.size() - 6) + " more)";
    fail("checkpoint '" + dir + "' holds " + std::to_string(unused.size()) + " tensor(s) the config does not use: " +
         list + "; does num_hidden_layers (" + std::to_string(c.n_layers) +
         ") or tie_word_embeddings match the checkpoint?");
  }

  layout_weights(w);
  int layers_done = 0;
  const bool show = progress && ckpt.total_bytes() > (256u << 20);  // only worth it for a few hundred MB and more
  for_each_tensor(c, &w, [&](const std::string& name, const std::vector<ExpectedDim>&, float* dst) {
    read_f32(ckpt.get(name), dst);
    if (show && ends_with(name, ".mlp.down_proj.weight")) progress(++layers_done, c.n_layers);
  });
  return w;
}

}  // namespace flashlite::engine
