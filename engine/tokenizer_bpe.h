#pragma once
// BPE with merge ranks (Hugging Face tokenizer.json, GPT-2 files): the pieces the loaders fill in and the
// tokenizer that runs them. The pipeline follows Hugging Face `tokenizers` step for step, per call:
//   split out the added tokens matched on the raw text -> normalize each text segment -> split out the added tokens
//   matched on the normalized text -> pre-tokenize (each step on every piece, in order) -> BPE per piece.
#include <cstdint>
#include <memory>
#include <optional>
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
  bool lstrip = false, rstrip = false;  // the token swallows the whitespace before / after it
  bool normalized = false;              // matched in the normalized text (its content normalized too), else raw
};

struct NormalizerStep {
  enum Kind { prepend, replace } kind;
  std::string text;                // prepend: the prefix; replace: what each match becomes
  std::shared_ptr<Regex> pattern;  // replace: the matches (a literal String pattern is escaped)
};

// What Split does with the pattern's matches (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokenizerStep {
  enum Kind { split, byte_level, metaspace } kind;
  std::shared_ptr<Regex> regex;  // split: the pattern; byte_level with use_regex: the GPT-2 pattern
  SplitBehavior behavior = SplitBehavior::isolated;  // split
  bool invert = false;                               // split: the pattern marks the pieces, not the delimiters
  bool add_prefix_space = false;                     // byte_level: a space before every piece that lacks one
  enum Prepend { always, first, never } prepend = always;  // metaspace (first: only the piece that starts the text)
  bool metaspace_split = true;
  std::string replacement = "\xE2\x96\x81";  // metaspace: U+2581
};

struct BpeSpec {
  std::unordered_map<std::string, int> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order; a repeated pair keeps its last rank
  bool ignore_merges = false;
  bool byte_fallback = false;            // an unknown character becomes its <0xXX> byte tokens, when all exist
  std::optional<std::string> unk_token;  // looked up in `vocab` only when a character needs it (an error if absent)
  bool fuse_unk = false;                 // a run of unknown characters becomes one unk token
  std::vector<AddedToken> added;         // distinct contents, with the ids Hugging Face gives them
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool decode_byte_level = false;   // decoder maps GPT-2's byte characters back to bytes
  bool decode_metaspace = false;    // decoder turns U+2581 into spaces and <0xXX> into bytes
  bool decode_strip_first_space = false;
  int bos_id = -1;
  std::string source;  // for messages
};

// Checks the id space (ids below kMaxVocabSize, at most about twice as many ids as tokens) before anything is sized
// by it; throws Error naming the source, the field and the limit.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// GPT-2's reversible byte <-> printable-unicode mapping: the UTF-8 text of byte b's character.
const std::string& byte_to_unicode(uint8_t b);
// The GPT-2 pre-tokenizer pattern (used by ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

}  // namespace flashlite::engine
