#include "model_paths.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "engine/parallel/parallel_model.h"
#include "flashlite/errors.h"

namespace flashlite::cli {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& message) { throw Error(ErrorKind::invalid_value, message); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// llama2.c names its tokenizers tokenizer.bin or tok<vocab>.bin (tok512.bin); every other .bin is taken for a model.
bool is_llama2c_tokenizer(const std::string& name) { return name.rfind("tok", 0) == 0 && ends_with(name, ".bin"); }

// Names of the regular files in `dir` whose name passes `keep`, sorted.
template <class Keep>
std::vector<std::string> files_in(const fs::path& dir, Keep keep) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && keep(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  if (!is_dir(path)) return path;  // a file (or nothing): the loader reads it or names what is wrong
  const fs::path dir(path);
  // A Hugging Face directory, even one missing config.json: the loader's message says what it lacks.
  if (path_exists(dir / "config.json") || !files_in(dir, [](const std::string& n) { return ends_with(n, ".safetensors"); }).empty()) {
    return path;
  }
  const std::vector<std::string> models =
      files_in(dir, [](const std::string& n) { return ends_with(n, ".bin") && !is_llama2c_tokenizer(n); });
  if (models.size() == 1) return (dir / models[0]).string();
  if (models.empty()) {
    fail("'" + path + "' holds neither a Hugging Face checkpoint (config.json) nor a llama2.c model (a .bin other than "
         "tok*.bin); pass a checkpoint directory or a llama2.c .bin file to --model");
  }
  fail("'" + path + "' holds several llama2.c models (" + joined(models) + "); pass one of them, e.g. --model " +
       (dir / models[0]).string());
}

std::string tokenizer_beside(const std::string& checkpoint) {
  if (is_dir(checkpoint)) return checkpoint;
  const fs::path model(checkpoint);
  const fs::path dir = model.has_parent_path() ? model.parent_path() : fs::path(".");
  const std::string self = model.filename().string();
  const std::vector<std::string> toks =
      files_in(dir, [&](const std::string& n) { return is_llama2c_tokenizer(n) && n != self; });
  if (toks.size() == 1) return (dir / toks[0]).string();
  if (toks.size() > 1) {
    fail("'" + dir.string() + "' holds several llama2.c tokenizers (" + joined(toks) + "); pass one with --tokenizer, e.g. "
         "--tokenizer " + (dir / toks[0]).string());
  }
  if (path_exists(dir / "tokenizer.json")) return (dir / "tokenizer.json").string();
  fail("no tokenizer beside the llama2.c checkpoint '" + checkpoint + "' (looked for tok*.bin and tokenizer.json in '" +
       dir.string() + "'); pass its tokenizer with --tokenizer (e.g. tok512.bin)");
}

std::string resolve_tokenizer(const std::string& path) {
  if (!is_dir(path)) return path;
  const fs::path dir(path);
  for (const char* hf : {"tokenizer.json", "encoder.json", "vocab.json"}) {
    if (path_exists(dir / hf)) return path;
  }
  const std::vector<std::string> toks = files_in(dir, is_llama2c_tokenizer);
  if (toks.size() == 1) return (dir / toks[0]).string();
  if (toks.size() > 1) {
    fail("'" + path + "' holds several llama2.c tokenizers (" + joined(toks) + "); pass one of them, e.g. --model " +
         (dir / toks[0]).string());
  }
  return path;  // the loader names the files it looked for
}

Checkpoint load_model_checkpoint(const std::string& path, int tp, const engine::LoadProgress& progress) {
  Checkpoint c;
  c.path = path;
  if (tp > 1) {
    c.config = engine::load_checkpoint_config(path);
  } else {
    c.weights = engine::load_checkpoint(path, progress);
    c.config = c.weights.config;
  }
  return c;
}

std::unique_ptr<engine::LlamaModel> make_model(const Checkpoint& c, const engine::RuntimeOptions& ro,
                                               const std::string& device) {
  if (ro.tp > 1) return engine::load_parallel_model(c.path, ro, device);
  return engine::create_model(c.weights, ro, device);
}

}  // namespace flashlite::cli
