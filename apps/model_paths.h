#pragma once
// What `--model` / `--tokenizer` name, resolved to the files the engine loads: a Hugging Face directory (config.json)
// stays as it is; a llama2.c folder resolves to its one .bin model, and a llama2.c model's tokenizer to the one
// tok*.bin beside it. Where the choice is not unique (or there is nothing to choose) the error lists the candidates
// and says which option to pass.
#include <string>

namespace flashlite::cli {

// The checkpoint to load for `--model path`.
std::string resolve_checkpoint(const std::string& path);
// The tokenizer for a resolved checkpoint when --tokenizer is absent: the Hugging Face directory itself, or the
// llama2.c tokenizer beside the .bin file (tok*.bin, else a tokenizer.json in the same folder).
std::string tokenizer_beside(const std::string& checkpoint);
// `tokenize --model path`: a tokenizer file, a directory the tokenizer loader reads (tokenizer.json, GPT-2 files), or a
// llama2.c folder with one tok*.bin.
std::string resolve_tokenizer(const std::string& path);

}  // namespace flashlite::cli
