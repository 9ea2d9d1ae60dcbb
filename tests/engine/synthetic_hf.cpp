#include "synthetic_hf.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

namespace synth {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Rounds to the storage dtype (the test's own conversions) and returns the stored bytes.
uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);  // round to nearest even (inputs are finite)
  return uint16_t(b >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

std::string encode(const std::string& dtype, std::vector<double>& v) {
  std::string out;
  for (double& x : v) {
    if (dtype == "F32") {
      const float f = float(x);
      x = f;
      out.append(reinterpret_cast<const char*>(&f), 4);
    } else if (dtype == "F16") {
      const _Float16 h = _Float16(float(x));
      x = double(float(h));
      out.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      const uint16_t h = to_bf16(float(x));
      x = from_bf16(h);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

// Writes `tensors` as one safetensors file; returns the file bytes so tests can corrupt them.
}  // namespace

std::string safetensors_bytes(const std::string& dtype, std::vector<Tensor>& tensors) {
  json header = json::object();
  std::string data;
  for (Tensor& t : tensors) {
    const std::string bytes = encode(dtype, *t.values);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h + data;
}

void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary).write(s.data(), s.size()); }

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("flashlite_hf_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json config_json(const Spec& s) {
  json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", s.dim},
            {"intermediate_size", s.hidden}, {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"vocab_size", s.vocab},
            {"max_position_embeddings", s.max_positions}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", s.tied},
            {"hidden_act", "silu"}, {"torch_dtype", "float32"}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  const Rope r = s.llama3_scaling ? kLlama3Rope : s.rope;
  json scaling = json::object();
  if (r.type) {
    scaling[r.type_key] = r.type;
    if (std::strcmp(r.type, "default") != 0) scaling["factor"] = r.factor;
    if (std::strcmp(r.type, "llama3") == 0) {
      scaling["low_freq_factor"] = r.low_freq_factor;
      scaling["high_freq_factor"] = r.high_freq_factor;
      scaling["original_max_position_embeddings"] = r.original_max_position;
    }
  }
  if (r.parameters) {
    scaling["rope_theta"] = r.theta;
    c["rope_parameters"] = scaling;
  } else {
    c["rope_theta"] = r.theta;
    if (r.type) c["rope_scaling"] = scaling;
  }
  return c;
}

void set_rope(const Spec& s, reftest::RefModel& m) {
  // "default" is no scaling; so is a type the reference lacks (yarn, ...), which the engine must refuse anyway.
  const Rope r = s.llama3_scaling ? kLlama3Rope : s.rope;
  using Scaling = reftest::RefModel::Scaling;
  m.theta = r.theta;
  m.scaling = !r.type                              ? Scaling::none
              : std::strcmp(r.type, "linear") == 0 ? Scaling::linear
              : std::strcmp(r.type, "llama3") == 0 ? Scaling::llama3
                                                   : Scaling::none;
  m.scale_factor = r.factor, m.low_freq = r.low_freq_factor, m.high_freq = r.high_freq_factor;
  m.original_ctx = r.original_max_position;
}

// Random model (weights ~ N(0, 0.3/sqrt(fan_in)), norms around 1) written to `dir`; returns the stored values.
reftest::RefModel write_checkpoint(const fs::path& dir, const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  reftest::RefModel m;
  m.dim = s.dim, m.hidden = s.hidden, m.layers = s.layers, m.heads = s.heads, m.kv_heads = s.kv_heads;
  m.head_dim = s.head_dim, m.vocab = s.vocab, m.seq_len = s.max_positions, m.eps = 1e-5;
  m.interleaved = false, m.tied = s.tied;
  set_rope(s, m);
  auto randn = [&](size_t n, double sd, double mean = 0) {
    std::vector<double> v(n);
    for (double& x : v) x = mean + sd * nd(rng);
    return v;
  };
  const size_t qd = size_t(s.heads) * s.head_dim, kvd = size_t(s.kv_heads) * s.head_dim;
  m.emb = randn(size_t(s.vocab) * s.dim, 1.0);
  for (int l = 0; l < s.layers; ++l) {
    m.rms_att.push_back(randn(s.dim, 0.1, 1.0));
    m.wq.push_back(randn(qd * s.dim, 0.6 / std::sqrt(s.dim)));
    m.wk.push_back(randn(kvd * s.dim, 0.6 / std::sqrt(s.dim)));
    m.wv.push_back(randn(kvd * s.dim, 1.0 / std::sqrt(s.dim)));
    m.wo.push_back(randn(s.dim * qd, 0.5 / std::sqrt(qd)));
    m.rms_ffn.push_back(randn(s.dim, 0.1, 1.0));
    m.w1.push_back(randn(size_t(s.hidden) * s.dim, 1.0 / std::sqrt(s.dim)));
    m.w3.push_back(randn(size_t(s.hidden) * s.dim, 1.0 / std::sqrt(s.dim)));
    m.w2.push_back(randn(size_t(s.dim) * s.hidden, 0.5 / std::sqrt(s.hidden)));
  }
  m.rms_final = randn(s.dim, 0.1, 1.0);
  m.wcls = s.tied ? std::vector<double>() : randn(size_t(s.vocab) * s.dim, 1.0 / std::sqrt(s.dim));

  std::vector<Tensor> ts;
  const int64_t D = s.dim, H = s.hidden;
  ts.push_back({"model.embed_tokens.weight", {s.vocab, D}, &m.emb});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back({p + "input_layernorm.weight", {D}, &m.rms_att[l]});
    ts.push_back({p + "self_attn.q_proj.weight", {int64_t(qd), D}, &m.wq[l]});
    ts.push_back({p + "self_attn.k_proj.weight", {int64_t(kvd), D}, &m.wk[l]});
    ts.push_back({p + "self_attn.v_proj.weight", {int64_t(kvd), D}, &m.wv[l]});
    ts.push_back({p + "self_attn.o_proj.weight", {D, int64_t(qd)}, &m.wo[l]});
    ts.push_back({p + "post_attention_layernorm.weight", {D}, &m.rms_ffn[l]});
    ts.push_back({p + "mlp.gate_proj.weight", {H, D}, &m.w1[l]});
    ts.push_back({p + "mlp.up_proj.weight", {H, D}, &m.w3[l]});
    ts.push_back({p + "mlp.down_proj.weight", {D, H}, &m.w2[l]});
  }
  ts.push_back({"model.norm.weight", {D}, &m.rms_final});
  if (!s.tied) ts.push_back({"lm_head.weight", {s.vocab, D}, &m.wcls});
  if (s.shards == 0) {
    write_file(dir / "model.safetensors", safetensors_bytes(s.dtype, ts));
  } else {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    const size_t per = (ts.size() + s.shards - 1) / s.shards;
    for (int k = 0; k < s.shards; ++k) {
      std::vector<Tensor> part(ts.begin() + std::min(ts.size(), k * per), ts.begin() + std::min(ts.size(), (k + 1) * per));
      const std::string fname = "model-0000" + std::to_string(k + 1) + "-of-0000" + std::to_string(s.shards) + ".safetensors";
      write_file(dir / fname, safetensors_bytes(s.dtype, part));
      for (const Tensor& t : part) index["weight_map"][t.name] = fname;
    }
    write_file(dir / "model.safetensors.index.json", index.dump(1));
  }
  if (s.tied) m.wcls = m.emb;
  write_file(dir / "config.json", config_json(s).dump(2));
  write_file(dir / "generation_config.json", json({{"eos_token_id", {2, 3}}, {"bos_token_id", 1}}).dump());
  return m;
}


}  // namespace synth
