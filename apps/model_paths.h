#pragma once
// What `--model` / `--tokenizer` name, resolved to the files the engine loads: a Hugging Face directory (config.json)
// stays as it is; a llama2.c folder resolves to its one .bin model, and a llama2.c model's tokenizer to the one
// tok*.bin beside it. Where the choice is not unique (or there is nothing to choose) the error lists the candidates
// and says which option to pass.
#include <memory>
#include <string>

#include "engine/model.h"
#include "engine/weights.h"

namespace flashlite::cli {

// The checkpoint to load for `--model path`.
std::string resolve_checkpoint(const std::string& path);
// The tokenizer for a resolved checkpoint when --tokenizer is absent: the Hugging Face directory itself, or the
// llama2.c tokenizer beside the .bin file (tok*.bin, else a tokenizer.json in the same folder).
std::string tokenizer_beside(const std::string& checkpoint);
// `tokenize --model path`: a tokenizer file, a directory the tokenizer loader reads (tokenizer.json, GPT-2 files), or a
// llama2.c folder with one tok*.bin.
std::string resolve_tokenizer(const std::string& path);

// A resolved checkpoint as the model commands hold it: its config, and its weights whole, except under --tp > 1
// where each tensor-parallel rank loads only its own blocks once the model is made (nothing is loaded whole).
struct Checkpoint {
  std::string path;
  engine::ModelConfig config;
  engine::ModelWeights weights;  // empty when tp > 1
};
Checkpoint load_model_checkpoint(const std::string& path, int tp, const engine::LoadProgress& progress = {});
// The model over `c` (which must outlive it) with options `ro` on `device`.
std::unique_ptr<engine::LlamaModel> make_model(const Checkpoint& c, const engine::RuntimeOptions& ro,
                                               const std::string& device);

}  // namespace flashlite::cli
