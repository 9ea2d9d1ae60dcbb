// Reads Hugging Face tokenizer.json and the original GPT-2 files into a BpeSpec, as strictly as Hugging Face
// `tokenizers` reads them (the same required fields and types, ids as unsigned 32-bit integers, added-token ids as it
// assigns them), so a file either loads and encodes as it does there or is rejected with a message that names the
// file, the key and what was expected. Components flashlite does not implement (WordPiece/Unigram models, NFKC
// normalizers, Whitespace pre-tokenizers, BPE dropout, ...) are rejected with "unsupported", never ignored.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/errors.h"
#include "engine/mapped_file.h"
#include "engine/tokenizer_bpe.h"

namespace flashlite::engine {

using json = nlohmann::json;

namespace {

constexpr int kMaxNesting = 32;  // Sequence inside Sequence ...

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string json_message(const json::exception& e) {
  const std::string m = e.what();
  const size_t tag = m.rfind("] ", m.find(' '));
  return tag == std::string::npos ? m : m.substr(tag + 2);
}

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("'" + path + "' is not valid JSON: " + json_message(e));
  }
}

std::string clip(const std::string& s, size_t n = 40) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

// A short description of a value for messages (never the whole of a large object).
std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "the integer " + v.dump();
    case json::value_t::number_float: return "the number " + v.dump();
    case json::value_t::string: return "the string \"" + clip(v.get<std::string>()) + "\"";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unreadable value";
  }
}

std::string at(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// Typed access to one file's JSON. Every failure names the file and the key path, e.g. "model.vocab['ab']".
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    fail(source_ + ": '" + path + "' " + what);
  }
  [[noreturn]] void expected(const std::string& path, const std::string& what, const json& found) const {
    error(path, "must be " + what + ", found " + describe(found));
  }

  static const json* member(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  const json& required(const json& obj, const std::string& path, const char* key) const {
    const json* v = member(obj, key);
    if (!v) error(at(path, key), "is missing");
    return *v;
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) expected(path, "an object", v);
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) expected(path, "an array", v);
    return v;
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) expected(path, "true or false", v);
    return v.get<bool>();
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) expected(path, "a string", v);
    return v.get<std::string>();
  }
  // One Unicode character, as a string.
  std::string character(const json& v, const std::string& path) const {
    const std::string s = string(v, path);
    const std::vector<std::string_view> chars = utf8_chars(s);
    if (chars.size() != 1) expected(path, "a single character", v);
    return s;
  }
  // A JSON integer in [0, max]: floats (even 5.0), strings and out-of-range values are errors.
  uint64_t integer(const json& v, const std::string& path, uint64_t max, const char* what) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > max) expected(path, what, v);
    return v.get<uint64_t>();
  }
  uint32_t u32(const json& v, const std::string& path) const {
    return uint32_t(integer(v, path, UINT32_MAX, "a non-negative integer below 2^32"));
  }
  // A token id: a u32 as Hugging Face reads it, and below kMaxVocabSize, which flashlite allocates by.
  int token_id(const json& v, const std::string& path) const {
    const uint32_t id = u32(v, path);
    if (id >= uint32_t(kMaxVocabSize)) {
      error(path, "is " + std::to_string(id) + "; token ids must be below " + std::to_string(kMaxVocabSize) +
                      " (larger is unsupported)");
    }
    return int(id);
  }
  // Optional fields (absent or null: the default).
  std::optional<bool> opt_boolean(const json& obj, const std::string& path, const char* key) const {
    const json* v = member(obj, key);
    if (!v || v->is_null()) return std::nullopt;
    return boolean(*v, at(path, key));
  }
  std::optional<std::string> opt_string(const json& obj, const std::string& path, const char* key) const {
    const json* v = member(obj, key);
    if (!v || v->is_null()) return std::nullopt;
    return string(*v, at(path, key));
  }
  // "<what> is unsupported (at '<path>'; <hint>)": something Hugging Face accepts that flashlite does not run.
  [[noreturn]] void unsupported(const std::string& path, const std::string& what, const std::string& hint = "") const {
    fail(source_ + ": " + what + " is unsupported (at '" + path + "'" + (hint.empty() ? "" : "; " + hint) + ")");
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

// {"String": literal} or {"Regex": pattern}, as a compiled regex.
std::shared_ptr<Regex> read_pattern(const Reader& r, const json& v, const std::string& path) {
  r.object(v, path);
  if (v.size() != 1) r.expected(path, "an object with one key, String or Regex", v);
  const json* lit = Reader::member(v, "String");
  const json* re = Reader::member(v, "Regex");
  if (!lit && !re) r.expected(path, "an object with one key, String or Regex", v);
  const std::string where = r.source() + ": '" + at(path, lit ? "String" : "Regex") + "'";
  if (lit) return std::make_shared<Regex>(Regex::escape(r.string(*lit, at(path, "String"))), where);
  return std::make_shared<Regex>(r.string(*re, at(path, "Regex")), where);
}

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

std::string component_type(const Reader& r, const json& v, const std::string& path, int depth) {
  if (depth > kMaxNesting) r.unsupported(path, "nesting deeper than " + std::to_string(kMaxNesting));
  r.object(v, path);
  return r.string(r.required(v, path, "type"), at(path, "type"));
}

void add_normalizer(const Reader& r, const json& n, const std::string& path, BpeSpec& s, int depth = 0) {
  const std::string t = component_type(r, n, path, depth);
  if (t == "Sequence") {
    const json& list = r.array(r.required(n, path, "normalizers"), at(path, "normalizers"));
    for (size_t i = 0; i < list.size(); ++i) add_normalizer(r, list[i], at(at(path, "normalizers"), i), s, depth + 1);
  } else if (t == "Prepend") {
    const std::string prefix = r.string(r.required(n, path, "prepend"), at(path, "prepend"));
    s.normalizers.push_back({NormalizerStep::prepend, prefix, nullptr});
  } else if (t == "Replace") {
    std::shared_ptr<Regex> pattern = read_pattern(r, r.required(n, path, "pattern"), at(path, "pattern"));
    // Hugging Face tokenizers mis-aligns (and then panics on) the text such a normalizer produces.
    if (pattern->may_match_empty())
      r.unsupported(at(path, "pattern"), "a Replace normalizer whose pattern can match empty text");
    const std::string content = r.string(r.required(n, path, "content"), at(path, "content"));
    s.normalizers.push_back({NormalizerStep::replace, content, pattern});
  } else if (one_of(t, {"Bert", "BertNormalizer", "Strip", "StripAccents", "NFC", "NFD", "NFKC", "NFKD", "Lowercase",
                        "Nmt", "Precompiled", "ByteLevel"})) {
    r.unsupported(at(path, "type"), "normalizer '" + t + "'");
  } else {
    r.error(at(path, "type"), "is '" + clip(t) + "'; expected a normalizer type (Sequence, Prepend or Replace)");
  }
}

struct MetaspaceSettings {
  std::string replacement;
  PreTokenizerStep::Prepend prepend = PreTokenizerStep::always;
  bool split = true;
};

MetaspaceSettings read_metaspace(const Reader& r, const json& m, const std::string& path) {
  MetaspaceSettings ms;
  ms.replacement = r.character(r.required(m, path, "replacement"), at(path, "replacement"));
  if (const json* v = Reader::member(m, "prepend_scheme")) {
    const std::string scheme = r.string(*v, at(path, "prepend_scheme"));
    if (scheme == "first") ms.prepend = PreTokenizerStep::first;
    else if (scheme == "never") ms.prepend = PreTokenizerStep::never;
    else if (scheme != "always") r.expected(at(path, "prepend_scheme"), "\"first\", \"never\" or \"always\"", *v);
  }
  ms.split = r.opt_boolean(m, path, "split").value_or(true);
  r.opt_string(m, path, "str_rep");
  if (r.opt_boolean(m, path, "add_prefix_space") == false) {
    if (ms.prepend != PreTokenizerStep::never)
      r.error(at(path, "add_prefix_space"), "is false, which contradicts prepend_scheme (not \"never\")");
  }
  return ms;
}

// ByteLevel's fields, shared by the pre-tokenizer and the decoder; returns (add_prefix_space, use_regex).
std::pair<bool, bool> read_byte_level(const Reader& r, const json& b, const std::string& path) {
  const bool add_prefix_space = r.boolean(r.required(b, path, "add_prefix_space"), at(path, "add_prefix_space"));
  r.boolean(r.required(b, path, "trim_offsets"), at(path, "trim_offsets"));  // offsets only: no effect on ids
  const json* use_regex = Reader::member(b, "use_regex");
  return {add_prefix_space, use_regex ? r.boolean(*use_regex, at(path, "use_regex")) : true};
}

void add_pre_tokenizer(const Reader& r, const json& p, const std::string& path, BpeSpec& s, int depth = 0) {
  const std::string t = component_type(r, p, path, depth);
  PreTokenizerStep st{};
  if (t == "Sequence") {
    const json& list = r.array(r.required(p, path, "pretokenizers"), at(path, "pretokenizers"));
    for (size_t i = 0; i < list.size(); ++i) add_pre_tokenizer(r, list[i], at(at(path, "pretokenizers"), i), s, depth + 1);
    return;
  }
  if (t == "Split") {
    st.kind = PreTokenizerStep::split;
    st.regex = read_pattern(r, r.required(p, path, "pattern"), at(path, "pattern"));
    const json& b = r.required(p, path, "behavior");
    const std::string behavior = b.is_string() ? b.get<std::string>() : "";
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::removed}, {"Isolated", SplitBehavior::isolated},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous}, {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    bool known = false;
    for (auto [name, value] : kBehaviors) {
      if (behavior == name) st.behavior = value, known = true;
    }
    if (!known) r.expected(at(path, "behavior"), "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous", b);
    st.invert = r.boolean(r.required(p, path, "invert"), at(path, "invert"));
  } else if (t == "ByteLevel") {
    st.kind = PreTokenizerStep::byte_level;
    auto [add_prefix_space, use_regex] = read_byte_level(r, p, path);
    st.add_prefix_space = add_prefix_space;
    if (use_regex) st.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else if (t == "Metaspace") {
    st.kind = PreTokenizerStep::metaspace;
    const MetaspaceSettings ms = read_metaspace(r, p, path);
    st.replacement = ms.replacement;
    st.prepend = ms.prepend;
    st.metaspace_split = ms.split;
  } else if (one_of(t, {"BertPreTokenizer", "Delimiter", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits",
                        "UnicodeScripts", "FixedLength"})) {
    r.unsupported(at(path, "type"), "pre-tokenizer '" + t + "'");
  } else {
    r.error(at(path, "type"),
            "is '" + clip(t) + "'; expected a pre-tokenizer type (Sequence, Split, ByteLevel or Metaspace)");
  }
  s.pre_tokenizers.push_back(std::move(st));
}

// The decoder only shapes decode_token(); its fields are still checked as Hugging Face checks them.
void read_decoder(const Reader& r, const json& d, const std::string& path, BpeSpec& s, int depth = 0) {
  const std::string t = component_type(r, d, path, depth);
  if (t == "Sequence") {
    const json& list = r.array(r.required(d, path, "decoders"), at(path, "decoders"));
    for (size_t i = 0; i < list.size(); ++i) read_decoder(r, list[i], at(at(path, "decoders"), i), s, depth + 1);
  } else if (t == "ByteLevel") {
    read_byte_level(r, d, path);
    s.decode_byte_level = true;
  } else if (t == "Metaspace") {
    s.decode_metaspace = true;
    if (read_metaspace(r, d, path).prepend != PreTokenizerStep::never) s.decode_strip_first_space = true;
  } else if (t == "Replace") {
    read_pattern(r, r.required(d, path, "pattern"), at(path, "pattern"));
    r.string(r.required(d, path, "content"), at(path, "content"));
    s.decode_metaspace = true;
  } else if (t == "ByteFallback" || t == "Fuse") {
    s.decode_metaspace = true;
  } else if (t == "Strip") {
    r.character(r.required(d, path, "content"), at(path, "content"));
    const uint64_t start = r.integer(r.required(d, path, "start"), at(path, "start"), UINT64_MAX, "a non-negative integer");
    r.integer(r.required(d, path, "stop"), at(path, "stop"), UINT64_MAX, "a non-negative integer");
    if (start > 0) s.decode_strip_first_space = true;
  } else if (one_of(t, {"BPEDecoder", "WordPiece", "CTC"})) {
    r.unsupported(at(path, "type"), "decoder '" + t + "'");
  } else {
    r.error(at(path, "type"), "is '" + clip(t) + "'; expected a decoder type");
  }
}

void read_vocab(const Reader& r, const json& v, const std::string& path, BpeSpec& s) {
  r.object(v, path);
  s.vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const json& id = it.value();  // the path is only spelled out for a message
    const bool ok = id.is_number_unsigned() && id.get<uint64_t>() < uint64_t(kMaxVocabSize);
    s.vocab[it.key()] = ok ? int(id.get<uint64_t>()) : r.token_id(id, path + "[\"" + clip(it.key()) + "\"]");
  }
}

// Merges: all "a b" strings (one space) or all ["a", "b"] pairs, as Hugging Face accepts them.
void read_merges(const Reader& r, const json& m, const std::string& path, BpeSpec& s) {
  r.array(m, path);
  const bool strings = std::all_of(m.begin(), m.end(), [](const json& e) { return e.is_string(); });
  s.merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const json& e = m[i];
    if (strings) {
      const std::string line = e.get<std::string>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        r.expected(at(path, i), "two tokens separated by one space", e);
      s.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      s.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      r.expected(at(path, i), "a pair [\"a\", \"b\"] (merges are all \"a b\" strings or all pairs)", e);
    }
  }
}

void read_model(const Reader& r, const json& m, BpeSpec& s) {
  const std::string path = "model";
  r.object(m, path);
  if (const json* t = Reader::member(m, "type")) {
    const std::string type = r.string(*t, "model.type");
    if (one_of(type, {"WordPiece", "WordLevel", "Unigram"}))
      r.unsupported("model.type", "model type '" + type + "'", "flashlite runs BPE models only");
    if (type != "BPE") r.error("model.type", "is '" + clip(type) + "'; expected BPE");
  } else if (!Reader::member(m, "vocab") || !Reader::member(m, "merges")) {
    r.unsupported("model", "a model that is not BPE (no type, no vocab + merges)");
  }
  if (const json* d = Reader::member(m, "dropout"); d && !d->is_null()) {
    if (!d->is_number()) r.expected("model.dropout", "null or a number", *d);
    const float p = d->get<float>();
    if (!(p >= 0.0f && p <= 1.0f)) r.expected("model.dropout", "between 0 and 1", *d);
    if (p > 0.0f) r.unsupported("model.dropout", "BPE dropout (random merges)");
  }
  if (const json* u = Reader::member(m, "unk_token"); u && !u->is_null()) s.unk_token = r.string(*u, "model.unk_token");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (r.opt_string(m, path, affix).value_or("") != "") r.unsupported(at(path, affix), "a non-empty " + std::string(affix));
  }
  s.fuse_unk = r.opt_boolean(m, path, "fuse_unk").value_or(false);
  s.byte_fallback = r.opt_boolean(m, path, "byte_fallback").value_or(false);
  s.ignore_merges = r.opt_boolean(m, path, "ignore_merges").value_or(false);
  read_vocab(r, r.required(m, path, "vocab"), "model.vocab", s);
  read_merges(r, r.required(m, path, "merges"), "model.merges", s);
}

// Added tokens with the ids Hugging Face gives them: the vocabulary's id for a token already in it, else the next
// id after the vocabulary's entries, in file order; the id the file declares must agree. A repeated content keeps
// its first id and takes the later flags (special once special stays special). Empty contents are ignored. In the
// result, of several tokens on one id (a vocabulary with repeated ids) the last is the one Hugging Face matches.
void read_added_tokens(const Reader& r, const json& list, BpeSpec& s) {
  r.array(list, "added_tokens");
  int64_t next_id = int64_t(s.vocab.size());
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = at("added_tokens", i);
    const json& a = r.object(list[i], path);
    const int declared = r.token_id(r.required(a, path, "id"), at(path, "id"));
    AddedToken t;
    t.content = r.string(r.required(a, path, "content"), at(path, "content"));
    const bool single_word = r.boolean(r.required(a, path, "single_word"), at(path, "single_word"));
    t.lstrip = r.boolean(r.required(a, path, "lstrip"), at(path, "lstrip"));
    t.rstrip = r.boolean(r.required(a, path, "rstrip"), at(path, "rstrip"));
    t.normalized = r.boolean(r.required(a, path, "normalized"), at(path, "normalized"));
    t.special = r.boolean(r.required(a, path, "special"), at(path, "special"));
    if (t.content.empty()) continue;
    if (single_word) r.unsupported(at(path, "single_word"), "an added token with single_word true");
    int64_t id;
    if (auto it = index.find(t.content); it != index.end()) {
      // Hugging Face re-inserts it: it moves to the end (the last token on an id is the one matched and decoded).
      const size_t k = it->second;
      id = s.added[k].id;
      t.special = t.special || s.added[k].special;
      t.id = s.added[k].id;
      s.added.erase(s.added.begin() + long(k));
      s.added.push_back(t);
      for (auto& [content, pos] : index) pos -= pos > k ? 1 : 0;
      it->second = s.added.size() - 1;
    } else {
      auto v = s.vocab.find(t.content);
      id = v != s.vocab.end() ? v->second : next_id++;
      if (id >= kMaxVocabSize) {
        r.error(path, "gets id " + std::to_string(id) + "; token ids must be below " + std::to_string(kMaxVocabSize) +
                          " (larger is unsupported)");
      }
      t.id = int(id);
      index[t.content] = s.added.size();
      s.added.push_back(t);
    }
    if (declared != id) {
      r.error(at(path, "id"), "is " + std::to_string(declared) + ", but Hugging Face tokenizers gives '" + clip(t.content) +
                                  "' id " + std::to_string(id) + " (its model.vocab id, or the next after the " +
                                  std::to_string(s.vocab.size()) + " vocabulary entries); inconsistent ids are unsupported");
    }
  }
}

void read_tokenizer(const Reader& r, const json& j, BpeSpec& s) {
  if (!j.is_object()) fail(r.source() + " must hold a JSON object, found " + describe(j));
  if (const json* v = Reader::member(j, "version")) {
    if (r.string(*v, "version") != "1.0") r.expected("version", "\"1.0\"", *v);
  }
  // Truncation and padding are per-call settings (transformers overrides them on every call) and post-processing
  // (BOS/EOS templates) is the engine's job: checked for shape, otherwise ignored.
  for (const char* key : {"truncation", "padding", "post_processor"}) {
    const json* v = Reader::member(j, key);
    if (v && !v->is_null() && !v->is_object()) r.expected(key, "null or an object", *v);
  }
  const json& model = r.required(j, "", "model");
  try {
    read_model(r, model, s);
  } catch (const Error& e) {
    // Without a type, Hugging Face tries BPE, then WordPiece, WordLevel and Unigram: what is not a valid BPE model
    // may still load there as one of those.
    if (!model.is_object() || Reader::member(model, "type")) throw;
    fail(std::string(e.what()) + " (model.type is absent: not a valid BPE model, and other model types are unsupported)");
  }
  if (const json* a = Reader::member(j, "added_tokens")) read_added_tokens(r, *a, s);
  if (const json* n = Reader::member(j, "normalizer"); n && !n->is_null()) add_normalizer(r, *n, "normalizer", s);
  if (const json* p = Reader::member(j, "pre_tokenizer"); p && !p->is_null()) add_pre_tokenizer(r, *p, "pre_tokenizer", s);
  if (const json* d = Reader::member(j, "decoder"); d && !d->is_null()) read_decoder(r, *d, "decoder", s);
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  BpeSpec s;
  s.source = "tokenizer '" + path + "'";
  const json j = parse_json_file(path);
  try {
    read_tokenizer(Reader(s.source), j, s);
  } catch (const json::exception& e) {  // a backstop: the Reader checks every type before reading it
    fail(s.source + " could not be read: " + json_message(e));
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
  const Reader r(s.source);
  read_vocab(r, parse_json_file(encoder_json), "vocab", s);
  std::istringstream in(read_text_file(merges_txt));
  std::string line;
  json merges = json::array();
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  read_merges(Reader("GPT-2 merges '" + merges_txt + "'"), merges, "merges", s);
  PreTokenizerStep st{};
  st.kind = PreTokenizerStep::byte_level;
  st.regex = std::make_shared<Regex>(kGpt2Pattern);
  s.pre_tokenizers.push_back(std::move(st));
  s.decode_byte_level = true;
  if (auto it = s.vocab.find("<|endoftext|>"); it != s.vocab.end()) {
    s.added.push_back({it->second, "<|endoftext|>", true, false, false, false});
    s.bos_id = it->second;
  }
  return make_bpe_tokenizer(std::move(s));
}

}  // namespace flashlite::engine
