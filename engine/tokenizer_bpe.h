#pragma once
// BPE with merge ranks (Hugging Face tokenizer.json, GPT-2 files): the pieces the loaders fill in and the
// tokenizer that runs them. Pipeline per call: split out added tokens -> normalize -> pre-tokenize -> BPE per piece.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/regex.h"
#include "engine/tokenizer.h"

namespace flashlite::engine {

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false;
};

struct NormalizerStep {
  enum Kind { prepend, replace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct PreTokenizerStep {
  enum Kind { split, byte_level, metaspace } kind;
  std::shared_ptr<Regex> regex;  // split (pattern), byte_level with use_regex (the GPT-2 pattern)
  bool remove_matches = false;   // split: behavior Removed (else Isolated)
  bool invert = false;
  bool add_prefix_space = false;     // byte_level / metaspace (prepend_scheme always|first)
  bool prefix_first_only = false;    // metaspace prepend_scheme first
  bool metaspace_split = false;      // metaspace split
  std::string replacement = "\xE2\x96\x81";  // metaspace: U+2581
};

struct BpeSpec {
  std::unordered_map<std::string, int> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  bool ignore_merges = false;
  bool byte_fallback = false;
  int unk_id = -1;
  bool fuse_unk = false;  // a run of unknown characters becomes one unk token
  std::vector<AddedToken> added;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool byte_level = false;          // the model's alphabet is GPT-2's byte-to-unicode mapping
  bool decode_metaspace = false;    // decoder turns U+2581 into spaces and <0xXX> into bytes
  bool decode_strip_first_space = false;
  int bos_id = -1;
  std::string source;  // for messages
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// GPT-2's reversible byte <-> printable-unicode mapping: the UTF-8 text of byte b's character.
const std::string& byte_to_unicode(uint8_t b);
// The GPT-2 pre-tokenizer pattern (used by ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

}  // namespace flashlite::engine
