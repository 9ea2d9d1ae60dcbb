// Hugging Face Llama checkpoints: config.json + model.safetensors (or shards), converted to the fp32 CPU layout.
#include <set>
#include <string>

#include "engine/errors.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace flashlite::engine {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

void tie_if_head_missing(ModelConfig& c, const SafetensorsCheckpoint& ckpt) {
  if (!c.tie_embeddings && !ckpt.has("lm_head.weight")) c.tie_embeddings = true;
}

ModelWeights load_hf_checkpoint(const std::string& dir, const LoadProgress& progress, int rank, int ranks) {
  ModelWeights w;
  w.config = load_hf_config(dir);
  const ModelConfig& c = w.config;
  SafetensorsCheckpoint ckpt(dir);
  // (Some exports keep lm_head even when tied: that one is checked and ignored below.)
  tie_if_head_missing(w.config, ckpt);
  w.shard = TensorShard::of(c, rank, ranks);

  // Every shape against the config before a byte is allocated: the arena is sized from config.json, so a config
  // that disagrees with the tensors (vocab_size 8M on a 512-token model) must fail here, not after gigabytes.
  std::set<std::string> used;
  for (const TensorSlot& t : tensor_slots(w)) {
    ckpt.expect(t.name, t.shape);
    used.insert(t.name);
  }
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
  // A rank reads only its blocks: the mapping's other pages are never touched.
  for (const TensorSlot& t : tensor_slots(w)) {
    read_f32_block(ckpt.get(t.name), t.block.row0, t.block.rows, t.block.col0, t.block.cols, t.dst);
    if (show && ends_with(t.name, ".mlp.down_proj.weight")) progress(++layers_done, c.n_layers);
  }
  return w;
}

}  // namespace flashlite::engine
