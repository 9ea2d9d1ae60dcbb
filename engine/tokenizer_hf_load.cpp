// Reads Hugging Face tokenizer.json and the original GPT-2 files into a BpeSpec. Unsupported components
// (WordPiece/Unigram models, NFKC normalizers, unknown pre-tokenizers) are rejected by name, never ignored.
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/errors.h"
#include "engine/mapped_file.h"
#include "engine/tokenizer_bpe.h"

namespace flashlite::engine {

using json = nlohmann::json;

namespace {

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("'" + path + "' is not valid JSON: " + e.what());
  }
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string("?")) : std::string("?"); }

void add_normalizer(const json& n, BpeSpec& s) {
  if (n.is_null()) return;
  const std::string t = type_of(n);
  if (t == "Sequence") {
    for (const json& e : n.at("normalizers")) add_normalizer(e, s);
  } else if (t == "Prepend") {
    s.normalizers.push_back({NormalizerStep::prepend, n.at("prepend").get<std::string>(), ""});
  } else if (t == "Replace") {
    const json& pat = n.at("pattern");
    if (!pat.contains("String")) fail(s.source + ": Replace normalizer with a regex pattern is unsupported");
    s.normalizers.push_back({NormalizerStep::replace, pat["String"].get<std::string>(), n.at("content").get<std::string>()});
  } else {
    fail(s.source + ": normalizer '" + t + "' is unsupported; expected none, Sequence, Prepend or Replace");
  }
}

void add_pre_tokenizer(const json& p, BpeSpec& s) {
  if (p.is_null()) return;
  const std::string t = type_of(p);
  PreTokenizerStep st{};
  if (t == "Sequence") {
    for (const json& e : p.at("pretokenizers")) add_pre_tokenizer(e, s);
    return;
  }
  if (t == "Split") {
    const json& pat = p.at("pattern");
    std::string re;
    if (pat.contains("Regex")) {
      re = pat["Regex"].get<std::string>();
    } else if (pat.contains("String")) {
      for (char c : pat["String"].get<std::string>()) {  // literal: escape every non-alphanumeric byte
        if (!std::isalnum(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80) re += '\\';
        re += c;
      }
    } else {
      fail(s.source + ": Split pre-tokenizer has no Regex or String pattern");
    }
    const std::string behavior = p.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated" && behavior != "Removed") {
      fail(s.source + ": Split behavior '" + behavior + "' is unsupported; expected Isolated or Removed");
    }
    st.kind = PreTokenizerStep::split;
    st.regex = std::make_shared<Regex>(re);
    st.remove_matches = behavior == "Removed";
    st.invert = p.value("invert", false);
  } else if (t == "ByteLevel") {
    st.kind = PreTokenizerStep::byte_level;
    st.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) st.regex = std::make_shared<Regex>(kGpt2Pattern);
    s.byte_level = true;
  } else if (t == "Metaspace") {
    st.kind = PreTokenizerStep::metaspace;
    st.replacement = p.value("replacement", std::string("\xE2\x96\x81"));
    const std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
    st.add_prefix_space = scheme != "never";
    st.prefix_first_only = scheme == "first";
    st.metaspace_split = p.value("split", true);
  } else {
    fail(s.source + ": pre-tokenizer '" + t + "' is unsupported; expected Split, ByteLevel, Metaspace or Sequence");
  }
  s.pre_tokenizers.push_back(std::move(st));
}

void read_decoder(const json& d, BpeSpec& s) {
  if (d.is_null()) return;
  const std::string t = type_of(d);
  if (t == "Sequence") {
    for (const json& e : d.at("decoders")) read_decoder(e, s);
  } else if (t == "ByteLevel") {
    s.byte_level = true;
  } else if (t == "Metaspace" || t == "Replace" || t == "ByteFallback" || t == "Fuse") {
    s.decode_metaspace = true;
    if (t == "Metaspace" && d.value("prepend_scheme", std::string("always")) != "never") s.decode_strip_first_space = true;
  } else if (t == "Strip") {
    if (d.value("start", 0) > 0) s.decode_strip_first_space = true;
  } else {
    fail(s.source + ": decoder '" + t + "' is unsupported");
  }
}

void read_merges(const json& merges, BpeSpec& s) {
  s.merges.reserve(merges.size());
  for (const json& m : merges) {
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const size_t sp = line.find(' ', 1);
      if (sp == std::string::npos) fail(s.source + ": merge '" + line + "' is not two tokens separated by a space");
      s.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      s.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail(s.source + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
}

void read_vocab(const json& v, BpeSpec& s) {
  if (!v.is_object()) fail(s.source + ": the vocabulary is not a JSON object of token -> id");
  s.vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer()) fail(s.source + ": token '" + it.key() + "' has a non-integer id");
    s.vocab[it.key()] = it.value().get<int>();
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  BpeSpec s;
  s.source = "tokenizer '" + path + "'";
  const json j = parse_json_file(path);
  try {
    const json& model = j.at("model");
    const std::string mt = model.value("type", std::string("BPE"));
    if (mt != "BPE") fail(s.source + ": model type '" + mt + "' is unsupported; expected BPE");
    if (!model.value("continuing_subword_prefix", json()).is_null() && !model["continuing_subword_prefix"].get<std::string>().empty())
      fail(s.source + ": continuing_subword_prefix is unsupported");
    if (!model.value("end_of_word_suffix", json()).is_null() && !model["end_of_word_suffix"].get<std::string>().empty())
      fail(s.source + ": end_of_word_suffix is unsupported");
    read_vocab(model.at("vocab"), s);
    read_merges(model.at("merges"), s);
    s.ignore_merges = model.value("ignore_merges", false);
    s.byte_fallback = model.value("byte_fallback", false);
    s.fuse_unk = model.value("fuse_unk", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = s.vocab.find(model["unk_token"].get<std::string>());
      if (it != s.vocab.end()) s.unk_id = it->second;
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken t;
        t.id = a.at("id").get<int>();
        t.content = a.at("content").get<std::string>();
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        s.added.push_back(std::move(t));
      }
    }
    add_normalizer(j.value("normalizer", json()), s);
    add_pre_tokenizer(j.value("pre_tokenizer", json()), s);
    read_decoder(j.value("decoder", json()), s);
  } catch (const json::exception& e) {
    fail(s.source + " is malformed: " + e.what());
  }
  for (const char* bos : {"<|begin_of_text|>", "<s>", "<|endoftext|>"}) {
    for (const AddedToken& a : s.added)
      if (a.content == bos && s.bos_id < 0) s.bos_id = a.id;
  }
  return make_bpe_tokenizer(std::move(s));
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& merges_txt) {
  BpeSpec s;
  s.source = "GPT-2 tokenizer '" + encoder_json + "'";
  read_vocab(parse_json_file(encoder_json), s);
  std::istringstream in(read_text_file(merges_txt));
  std::string line;
  json merges = json::array();
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  read_merges(merges, s);
  PreTokenizerStep st{};
  st.kind = PreTokenizerStep::byte_level;
  st.regex = std::make_shared<Regex>(kGpt2Pattern);
  s.pre_tokenizers.push_back(std::move(st));
  s.byte_level = true;
  if (auto it = s.vocab.find("<|endoftext|>"); it != s.vocab.end()) {
    s.added.push_back({it->second, "<|endoftext|>", true, false, false});
    s.bos_id = it->second;
  }
  return make_bpe_tokenizer(std::move(s));
}

}  // namespace flashlite::engine
