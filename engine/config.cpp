#include "engine/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/errors.h"
#include "engine/mapped_file.h"

namespace flashlite::engine {

using json = nlohmann::json;

void ModelConfig::validate(const std::string& where) const {
  auto in_range = [&](int v, const char* name, int limit) {
    if (v <= 0) fail(where + ": " + name + " is " + std::to_string(v) + "; expected a positive integer");
    if (v > limit) fail(where + ": " + name + " is " + std::to_string(v) + "; expected at most " + std::to_string(limit));
  };
  using L = ConfigLimits;
  in_range(dim, "hidden_size (dim)", L::dim);
  in_range(hidden_dim, "intermediate_size (hidden_dim)", L::hidden_dim);
  in_range(n_layers, "num_hidden_layers (n_layers)", L::n_layers);
  in_range(n_heads, "num_attention_heads (n_heads)", L::n_heads);
  in_range(n_kv_heads, "num_key_value_heads (n_kv_heads)", L::n_heads);
  in_range(head_dim, "head_dim", L::head_dim);
  in_range(vocab_size, "vocab_size", L::vocab_size);
  in_range(max_seq_len, "max_position_embeddings (seq_len)", L::max_seq_len);
  if (n_heads % n_kv_heads != 0) {
    fail(where + ": num_attention_heads " + std::to_string(n_heads) + " is not a multiple of num_key_value_heads " +
         std::to_string(n_kv_heads));
  }
  if (head_dim % 2 != 0) fail(where + ": head_dim " + std::to_string(head_dim) + " is odd; RoPE needs an even head_dim");
  auto positive_finite = [&](double v, const char* name) {
    if (!(v > 0) || !std::isfinite(v)) {
      fail(where + ": " + name + " is " + std::to_string(v) + "; expected a positive finite number");
    }
  };
  positive_finite(rms_eps, "rms_norm_eps");
  positive_finite(rope_theta, "rope_theta");
  positive_finite(rope_scaling.factor, "rope_scaling factor");
  positive_finite(rope_scaling.low_freq_factor, "rope_scaling low_freq_factor");
  positive_finite(rope_scaling.high_freq_factor, "rope_scaling high_freq_factor");
  in_range(rope_scaling.original_max_position, "rope_scaling original_max_position_embeddings", L::max_seq_len);
  if (rope_scaling.type == "llama3" && !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
    fail(where + ": rope_scaling high_freq_factor must exceed low_freq_factor");
  }
  // Token ids index the embedding: one outside the vocabulary would read past it.
  if (bos_id < -1 || bos_id >= vocab_size) {
    fail(where + ": bos_token_id " + std::to_string(bos_id) + " is outside the vocabulary of " + std::to_string(vocab_size));
  }
  for (int e : eos_ids) {
    if (e < 0 || e >= vocab_size) {
      fail(where + ": stop token (eos_token_id) " + std::to_string(e) + " is outside the vocabulary of " +
           std::to_string(vocab_size));
    }
  }
}

std::string ModelConfig::summary() const {
  return "llama (" + source + "): dim " + std::to_string(dim) + ", hidden " + std::to_string(hidden_dim) + ", layers " +
         std::to_string(n_layers) + ", heads " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
         " (q/kv), head_dim " + std::to_string(head_dim) + ", vocab " + std::to_string(vocab_size) + ", context " +
         std::to_string(max_seq_len) + ", rope theta " + std::to_string(rope_theta) +
         (rope_scaling.type != "none" ? " (" + rope_scaling.type + " scaling)" : "") +
         (tie_embeddings ? ", tied embeddings" : "") + ", " + dtype;
}

namespace {

// Typed reads of config.json keys. An absent or null key gives the fallback; a value of another type is an Error
// naming the file, the key, what it holds and what was expected (nlohmann's own type_error names neither).
const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& where, const char* key, const json& v, const char* expected) {
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  fail(where + ": '" + key + "' is " + shown + " (" + v.type_name() + "); expected " + expected);
}

// An integer value as an int; get<int> would silently truncate 2^40, and get<int64_t> wrap values above INT64_MAX.
int int32_of(const json& v, const std::string& where, const char* key) {
  if (!v.is_number_integer()) wrong_type(where, key, v, "an integer");
  if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT32_MAX) : v.get<int64_t>() < INT32_MIN) {
    fail(where + ": '" + key + "' = " + v.dump() + " is out of range; expected a 32-bit integer");
  }
  return int(v.get<int64_t>());
}

int get_int(const json& j, const char* key, const std::string& where, int fallback, bool required) {
  const json* v = find_key(j, key);
  if (!v) {
    if (required) fail(where + " lacks '" + key + "'");
    return fallback;
  }
  return int32_of(*v, where, key);
}

double get_num(const json& j, const char* key, const std::string& where, double fallback) {
  const json* v = find_key(j, key);
  if (!v) return fallback;
  if (!v->is_number()) wrong_type(where, key, *v, "a number");
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& where, bool fallback) {
  const json* v = find_key(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(where, key, *v, "true or false");
  return v->get<bool>();
}

std::string get_string(const json& j, const char* key, const std::string& where, const std::string& fallback) {
  const json* v = find_key(j, key);
  if (!v) return fallback;
  if (!v->is_string()) wrong_type(where, key, *v, "a string");
  return v->get<std::string>();
}

// eos_token_id: an int or a list of ints (a string such as "2" would silently leave no stop token).
std::vector<int> get_token_ids(const json& j, const char* key, const std::string& where, std::vector<int> fallback) {
  const json* v = find_key(j, key);
  if (!v) return fallback;
  if (v->is_number_integer()) return {int32_of(*v, where, key)};
  if (!v->is_array()) wrong_type(where, key, *v, "an integer or a list of integers");
  std::vector<int> out;
  for (const json& e : *v) {
    if (!e.is_number_integer()) wrong_type(where, key, *v, "an integer or a list of integers");
    out.push_back(int32_of(e, where, key));
  }
  return out;
}

void parse_rope_scaling(const json& rs, const std::string& where, const char* key, ModelConfig& c) {
  if (!rs.is_object()) wrong_type(where, key, rs, "an object");
  const std::string w = where + " " + key;
  const std::string type = get_string(rs, "rope_type", w, get_string(rs, "type", w, "default"));
  if (type == "default") return;
  if (type != "llama3" && type != "linear") {
    fail(where + ": rope_scaling type '" + type + "' is unsupported; expected default, llama3 or linear");
  }
  c.rope_scaling.type = type;
  c.rope_scaling.factor = get_num(rs, "factor", w, 1.0);
  c.rope_scaling.low_freq_factor = get_num(rs, "low_freq_factor", w, 1.0);
  c.rope_scaling.high_freq_factor = get_num(rs, "high_freq_factor", w, 4.0);
  c.rope_scaling.original_max_position = get_int(rs, "original_max_position_embeddings", w, 8192, false);
}

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("'" + path + "' is not valid JSON: " + json_error_text(e));
  }
}

ModelConfig parse_hf_config(const std::string& dir, const std::string& path, const json& j) {
  const std::string where = "'" + path + "'";
  if (!j.is_object()) fail(where + " is not a JSON object");
  const std::string model_type = get_string(j, "model_type", where, "");
  std::string arch;
  if (const json* a = find_key(j, "architectures")) {
    if (!a->is_array() || (!a->empty() && !(*a)[0].is_string())) wrong_type(where, "architectures", *a, "a list of strings");
    if (!a->empty()) arch = (*a)[0].get<std::string>();
  }
  if (model_type != "llama" && arch != "LlamaForCausalLM") {
    fail(where + ": architecture '" + (arch.empty() ? model_type : arch) +
         "' is unsupported; expected model_type 'llama' (LlamaForCausalLM)");
  }
  const std::string act = get_string(j, "hidden_act", where, "silu");
  if (act != "silu") fail(where + ": hidden_act '" + act + "' is unsupported; expected silu (SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (get_bool(j, key, where, false)) fail(where + ": " + key + " = true is unsupported");
  }

  ModelConfig c;
  c.source = "hf";
  c.rope_style = RopeStyle::half_split;
  c.dim = get_int(j, "hidden_size", where, 0, true);
  c.hidden_dim = get_int(j, "intermediate_size", where, 0, true);
  c.n_layers = get_int(j, "num_hidden_layers", where, 0, true);
  c.n_heads = get_int(j, "num_attention_heads", where, 0, true);
  c.n_kv_heads = get_int(j, "num_key_value_heads", where, c.n_heads, false);
  c.head_dim = get_int(j, "head_dim", where, c.n_heads > 0 ? c.dim / c.n_heads : 0, false);
  c.vocab_size = get_int(j, "vocab_size", where, 0, true);
  c.max_seq_len = get_int(j, "max_position_embeddings", where, 2048, false);
  c.rms_eps = float(get_num(j, "rms_norm_eps", where, 1e-6));
  c.tie_embeddings = get_bool(j, "tie_word_embeddings", where, false);
  c.dtype = get_string(j, "torch_dtype", where, get_string(j, "dtype", where, "float32"));
  // transformers >= 5 writes rope_parameters {rope_theta, rope_type, ...}; older versions rope_theta + rope_scaling.
  c.rope_theta = get_num(j, "rope_theta", where, 10000.0);
  if (const json* rp = find_key(j, "rope_parameters")) {
    if (!rp->is_object()) wrong_type(where, "rope_parameters", *rp, "an object");
    c.rope_theta = get_num(*rp, "rope_theta", where + " rope_parameters", c.rope_theta);
    parse_rope_scaling(*rp, where, "rope_parameters", c);
  }
  if (const json* rs = find_key(j, "rope_scaling")) parse_rope_scaling(*rs, where, "rope_scaling", c);
  c.bos_id = get_int(j, "bos_token_id", where, -1, false);
  c.eos_ids = get_token_ids(j, "eos_token_id", where, {});

  const std::string gen = dir + "/generation_config.json";
  if (file_exists(gen)) {
    const json g = parse_json_file(gen);
    const std::string gwhere = "'" + gen + "'";
    if (!g.is_object()) fail(gwhere + " is not a JSON object");
    c.eos_ids = get_token_ids(g, "eos_token_id", gwhere, c.eos_ids);
    c.bos_id = get_int(g, "bos_token_id", gwhere, c.bos_id, false);
  }
  c.validate(where);
  return c;
}

}  // namespace

ModelConfig load_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!file_exists(path)) fail("'" + dir + "' has no config.json (expected a Hugging Face checkpoint directory)");
  const json j = parse_json_file(path);
  try {
    return parse_hf_config(dir, path, j);
  } catch (const json::exception& e) {  // a read the helpers above missed: still name the file
    fail("'" + path + "' has an unexpected structure: " + json_error_text(e));
  }
}

RopeOptions rope_options(const ModelConfig& c) {
  RopeOptions r;
  r.enabled = true;
  r.theta = c.rope_theta;
  r.layout = c.rope_style == RopeStyle::interleaved ? RopeLayout::interleaved : RopeLayout::half_split;
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    r.linear_factor = s.factor;
  } else if (s.type == "llama3") {
    r.llama3 = true;
    r.llama3_factor = s.factor;
    r.llama3_low_freq_factor = s.low_freq_factor;
    r.llama3_high_freq_factor = s.high_freq_factor;
    r.llama3_original_max_position = s.original_max_position;
  }
  return r;
}

}  // namespace flashlite::engine
