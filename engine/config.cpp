#include "engine/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "engine/errors.h"
#include "engine/mapped_file.h"

namespace flashlite::engine {

using json = nlohmann::json;

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](int v, const char* name) {
    if (v <= 0) fail(where + ": " + name + " is " + std::to_string(v) + "; expected a positive integer");
  };
  positive(dim, "hidden_size (dim)");
  positive(hidden_dim, "intermediate_size (hidden_dim)");
  positive(n_layers, "num_hidden_layers");
  positive(n_heads, "num_attention_heads");
  positive(n_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_position_embeddings (seq_len)");
  if (n_heads % n_kv_heads != 0) {
    fail(where + ": num_attention_heads " + std::to_string(n_heads) + " is not a multiple of num_key_value_heads " +
         std::to_string(n_kv_heads));
  }
  if (head_dim % 2 != 0) fail(where + ": head_dim " + std::to_string(head_dim) + " is odd; RoPE needs an even head_dim");
  if (head_dim > 512) fail(where + ": head_dim " + std::to_string(head_dim) + " is unsupported; expected at most 512");
  if (!(rms_eps > 0) || !std::isfinite(rms_eps)) fail(where + ": rms_norm_eps must be a positive finite number");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail(where + ": rope_theta must be a positive finite number");
  if (!(rope_scaling.factor > 0)) fail(where + ": rope_scaling factor must be positive");
  if (rope_scaling.type == "llama3" && !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
    fail(where + ": rope_scaling high_freq_factor must exceed low_freq_factor");
  }
  for (int e : eos_ids) {
    if (e < 0 || e >= vocab_size) fail(where + ": stop token " + std::to_string(e) + " is outside the vocabulary");
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

int get_int(const json& j, const char* key, const std::string& where, int fallback, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) fail(where + " lacks '" + key + "'");
    return fallback;
  }
  if (!j[key].is_number_integer()) fail(where + ": '" + key + "' is not an integer");
  const int64_t v = j[key].get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) fail(where + ": '" + key + "' = " + std::to_string(v) + " is out of range");
  return int(v);
}

double get_num(const json& j, const char* key, const std::string& where, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) fail(where + ": '" + key + "' is not a number");
  return j[key].get<double>();
}

// eos_token_id may be an int or a list of ints.
std::vector<int> token_list(const json& j) {
  std::vector<int> out;
  if (j.is_number_integer()) out.push_back(j.get<int>());
  else if (j.is_array())
    for (const json& e : j)
      if (e.is_number_integer()) out.push_back(e.get<int>());
  return out;
}

void parse_rope_scaling(const json& rs, const std::string& where, ModelConfig& c) {
  if (rs.is_null()) return;
  if (!rs.is_object()) fail(where + ": rope_scaling is not an object");
  std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "llama3" && type != "linear") {
    fail(where + ": rope_scaling type '" + type + "' is unsupported; expected llama3, linear or none");
  }
  c.rope_scaling.type = type;
  c.rope_scaling.factor = get_num(rs, "factor", where, 1.0);
  c.rope_scaling.low_freq_factor = get_num(rs, "low_freq_factor", where, 1.0);
  c.rope_scaling.high_freq_factor = get_num(rs, "high_freq_factor", where, 4.0);
  c.rope_scaling.original_max_position = get_int(rs, "original_max_position_embeddings", where, 8192, false);
}

}  // namespace

ModelConfig load_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!file_exists(path)) fail("'" + dir + "' has no config.json (expected a Hugging Face checkpoint directory)");
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("'" + path + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object()) fail("'" + path + "' is not a JSON object");
  const std::string where = "'" + path + "'";
  const std::string model_type = j.value("model_type", std::string());
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  if (model_type != "llama" && arch != "LlamaForCausalLM") {
    fail(where + ": architecture '" + (arch.empty() ? model_type : arch) +
         "' is unsupported; expected model_type 'llama' (LlamaForCausalLM)");
  }
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") fail(where + ": hidden_act '" + act + "' is unsupported; expected silu (SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>()) fail(where + ": " + key + " = true is unsupported");
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
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  c.dtype = j.value("torch_dtype", j.value("dtype", std::string("float32")));
  // transformers >= 5 writes rope_parameters {rope_theta, rope_type, ...}; older versions rope_theta + rope_scaling.
  c.rope_theta = get_num(j, "rope_theta", where, 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    c.rope_theta = get_num(j["rope_parameters"], "rope_theta", where, c.rope_theta);
    parse_rope_scaling(j["rope_parameters"], where, c);
  }
  if (j.contains("rope_scaling")) parse_rope_scaling(j["rope_scaling"], where, c);
  if (j.contains("bos_token_id")) c.bos_id = j["bos_token_id"].is_number_integer() ? j["bos_token_id"].get<int>() : -1;
  if (j.contains("eos_token_id")) c.eos_ids = token_list(j["eos_token_id"]);

  const std::string gen = dir + "/generation_config.json";
  if (file_exists(gen)) {
    try {
      json g = json::parse(read_text_file(gen));
      if (g.contains("eos_token_id")) c.eos_ids = token_list(g["eos_token_id"]);
      if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) c.bos_id = g["bos_token_id"].get<int>();
    } catch (const json::exception& e) {
      fail("'" + gen + "' is not valid JSON: " + e.what());
    }
  }
  c.validate(where);
  return c;
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(c.rope_theta, double(2 * i) / c.head_dim);
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    for (double& f : inv) f /= s.factor;
  } else if (s.type == "llama3") {
    // Long wavelengths are slowed by `factor`, short ones kept, the band between blended (Llama 3.1 recipe).
    const double old_len = s.original_max_position;
    const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else {
        const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace flashlite::engine
