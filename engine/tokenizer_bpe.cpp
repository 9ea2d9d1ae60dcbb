#include "engine/tokenizer_bpe.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "engine/bpe_merge.h"
#include "engine/errors.h"

namespace flashlite::engine {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = utf8_encode(printable ? uint32_t(b) : uint32_t(256 + n++));
      to_byte[to_unicode[b]] = uint8_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// A piece of text on its way through the pipeline. `origin_len`: how many leading bytes come from the input's first
// character (Hugging Face's "original offset 0"), which is what Metaspace's prepend_scheme "first" asks about.
struct Piece {
  std::string text;
  size_t origin_len = 0;
};

Piece slice(const Piece& p, size_t b, size_t e) {
  return {p.text.substr(b, e - b), b < p.origin_len ? std::min(p.origin_len, e) - b : 0};
}

// Start of the whitespace run that ends at `end` (Unicode White_Space, whole characters).
size_t space_run_start(std::string_view s, size_t end) {
  while (end > 0) {
    size_t b = end - 1;
    while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    const std::vector<std::string_view> ch = utf8_chars(s.substr(b, end - b));
    if (ch.size() != 1 || !is_unicode_space(utf8_code_point(ch[0]))) break;
    end = b;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t space_run_length(std::string_view s) {
  size_t n = 0;
  for (std::string_view ch : utf8_chars(s)) {
    if (!is_unicode_space(utf8_code_point(ch))) break;
    n += ch.size();
  }
  return n;
}

// Hugging Face's split of one piece: the pattern's matches and the gaps between them, each flagged as a match (or
// not, when inverted), folded by the behavior; removed and empty spans are dropped.
struct Span {
  size_t b, e;
  bool match;
};

std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Span& s : spans) out.emplace_back(s.b, s.e);
      break;
    case SplitBehavior::removed:
      for (const Span& s : spans)
        if (!s.match) out.emplace_back(s.b, s.e);
      break;
    case SplitBehavior::contiguous:
      for (const Span& s : spans) {
        if (s.match == prev && !out.empty()) out.back().second = s.e;
        else out.emplace_back(s.b, s.e);
        prev = s.match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Span& s : spans) {
        if (s.match && !prev && !out.empty()) out.back().second = s.e;
        else out.emplace_back(s.b, s.e);
        prev = s.match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev && !out.empty()) out.back().first = it->b;
        else out.emplace_back(it->b, it->e);
        prev = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](auto r) { return r.first == r.second; }), out.end());
  return out;
}

// Matches and the gaps between them, in order (an empty match is a span of its own).
std::vector<Span> with_gaps(const std::vector<std::pair<size_t, size_t>>& matches, size_t size, bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b != prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != size) spans.push_back({prev, size, invert});
  return spans;
}

// Added tokens of one kind (raw or normalized), indexed by first byte, longest first.
struct AddedSet {
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  std::vector<Entry> entries;
  std::array<std::vector<int>, 256> by_first_byte;

  void build() {
    for (int i = 0; i < int(entries.size()); ++i)
      by_first_byte[static_cast<unsigned char>(entries[i].pattern[0])].push_back(i);
    for (auto& v : by_first_byte)
      std::stable_sort(v.begin(), v.end(),
                       [&](int a, int b) { return entries[a].pattern.size() > entries[b].pattern.size(); });
  }
  const Entry* longest_at(std::string_view s, size_t i) const {
    for (int k : by_first_byte[static_cast<unsigned char>(s[i])])
      if (s.compare(i, entries[k].pattern.size(), entries[k].pattern) == 0) return &entries[k];
    return nullptr;
  }
};

// A run of text (id < 0) or an added token (id), as byte offsets into the searched string.
struct Segment {
  size_t b, e;
  int id;
};

// Hugging Face's AddedVocabulary::find_matches: leftmost-longest matches, left to right; a match that is not used
// (a special token while special tokens are plain text) still hides what overlaps it. lstrip/rstrip widen the
// token over neighbouring whitespace, which is then dropped.
std::vector<Segment> find_added(std::string_view s, const AddedSet& set, bool parse_special,
                                const std::string& source) {
  std::vector<Segment> out;
  size_t start_offset = 0, i = 0;
  while (!set.entries.empty() && i < s.size()) {
    const AddedSet::Entry* m = set.longest_at(s, i);
    if (!m) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + m->pattern.size();
    i = stop;
    if (m->token->special && !parse_special) continue;
    if (m->token->lstrip) start = std::max(space_run_start(s, start), start_offset);
    if (m->token->rstrip) stop += space_run_length(s.substr(stop));
    if (start > stop) {  // whitespace already taken by the previous token's rstrip (Hugging Face panics here)
      fail(source + ": added token '" + m->token->content + "' at byte " + std::to_string(i - m->pattern.size()) +
           " lies inside the whitespace an earlier added token stripped (rstrip); the text cannot be split");
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    if (start < stop) out.push_back({start, stop, m->token->id});  // a token stripped down to nothing is dropped
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
  return out;
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec) : s_(std::move(spec)) {
    check_id_space();
    const size_t n = size_t(max_id_) + 1;
    id_to_token_.resize(n);
    std::vector<bool> named(n, false);
    for (const auto& [tok, id] : s_.vocab) {  // several tokens on one id: the smallest names it (deterministic)
      if (!named[id] || tok < id_to_token_[id]) id_to_token_[id] = tok;
      named[id] = true;
    }
    special_.assign(n, false);
    added_.assign(n, false);
    for (const AddedToken& a : s_.added) {
      id_to_token_[a.id] = a.content;
      added_[a.id] = true;
      added_ids_[a.content] = a.id;
      if (a.special) special_[a.id] = true;
    }
    merges_.reserve(s_.merges.size() * 2);
    for (size_t r = 0; r < s_.merges.size(); ++r) {
      const auto& [a, b] = s_.merges[r];
      auto ia = s_.vocab.find(a), ib = s_.vocab.find(b), im = s_.vocab.find(a + b);
      if (ia == s_.vocab.end() || ib == s_.vocab.end() || im == s_.vocab.end()) {
        fail(s_.source + ": model.merges[" + std::to_string(r) + "] ('" + a + "' '" + b +
             "') names a token that is not in model.vocab");
      }
      merges_.insert_or_assign(key(ia->second, ib->second), std::pair<int, int>(int(r), im->second));
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = s_.vocab.find(name);
      byte_ids_[b] = it == s_.vocab.end() ? -1 : it->second;
    }
    if (s_.unk_token) {
      auto it = s_.vocab.find(*s_.unk_token);
      unk_id_ = it == s_.vocab.end() ? -1 : it->second;
    }
    std::unordered_map<int, const AddedToken*> last_on_id;  // Hugging Face matches one token per id: the last
    for (const AddedToken& a : s_.added) last_on_id[a.id] = &a;
    std::unordered_map<std::string, const AddedToken*> normalized_patterns;
    for (const AddedToken& a : s_.added) {
      if (last_on_id[a.id] != &a) continue;
      if (!a.normalized) {
        raw_.entries.push_back({a.content, &a});
        continue;
      }
      std::string pattern = normalize(a.content, true).text;
      if (pattern.empty()) fail(s_.source + ": added token '" + a.content + "' normalizes to nothing (unsupported)");
      if (auto [it, fresh] = normalized_patterns.emplace(pattern, &a); !fresh) {
        fail(s_.source + ": added tokens '" + it->second->content + "' and '" + a.content + "' both normalize to '" +
             pattern + "'; which one matches is unspecified (Hugging Face picks by hash order): unsupported");
      }
      normalized_.entries.push_back({std::move(pattern), &a});
    }
    raw_.build();
    normalized_.build();
  }

  std::vector<int> encode(std::string_view text, bool parse_special) const override {
    std::vector<int> out;
    for (const Segment& seg : find_added(text, raw_, parse_special, s_.source)) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
        continue;
      }
      const Piece norm = normalize(text.substr(seg.b, seg.e - seg.b), seg.b == 0);
      for (const Segment& sub : find_added(norm.text, normalized_, parse_special, s_.source)) {
        if (sub.id >= 0) {
          out.push_back(sub.id);
          continue;
        }
        std::vector<Piece> pieces{slice(norm, sub.b, sub.e)};
        for (const PreTokenizerStep& st : s_.pre_tokenizers) pieces = pre_tokenize(st, pieces);
        for (const Piece& p : pieces) encode_piece(p.text, out);
      }
    }
    return out;
  }

  std::string decode_token(int id) const override {
    check_id(id);
    const std::string& t = id_to_token_[id];
    if (special_[id] || added_[id]) return t;
    if (s_.decode_byte_level) {
      std::string out;
      for (std::string_view ch : utf8_chars(t)) {
        auto it = byte_map().to_byte.find(std::string(ch));
        if (it != byte_map().to_byte.end()) out += char(it->second);
        else out += ch;
      }
      return out;
    }
    if (s_.decode_metaspace) {
      if (const int b = byte_token_value(t); b >= 0) return std::string(1, char(b));
      std::string out;
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, 3, "\xE2\x96\x81") == 0) {
          out += ' ';
          p += 3;
        } else {
          out += t[p++];
        }
      }
      return out;
    }
    return t;
  }

  int vocab_size() const override { return int(id_to_token_.size()); }
  std::optional<int> token_id(std::string_view token) const override {
    std::string t(token);
    if (auto it = added_ids_.find(t); it != added_ids_.end()) return it->second;
    if (auto it = s_.vocab.find(t); it != s_.vocab.end()) return it->second;
    return std::nullopt;
  }
  bool is_special(int id) const override { return id >= 0 && id < int(special_.size()) && special_[id]; }
  std::string kind() const override {
    const bool byte_level = std::any_of(s_.pre_tokenizers.begin(), s_.pre_tokenizers.end(),
                                        [](const PreTokenizerStep& st) { return st.kind == PreTokenizerStep::byte_level; });
    return std::string(byte_level ? "byte-level bpe" : "bpe") + " (" + std::to_string(s_.vocab.size()) + " tokens, " +
           std::to_string(s_.merges.size()) + " merges, " + std::to_string(s_.added.size()) + " added)";
  }
  int bos_id() const override { return s_.bos_id; }
  bool adds_dummy_prefix() const override { return s_.decode_strip_first_space; }

 private:
  static uint64_t key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  // The value of a "<0xXX>" token (two hex digits), or -1.
  static int byte_token_value(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (char c : t.substr(3, 2)) {
      const char* hex = "0123456789ABCDEF";
      const char* d = c ? std::strchr(hex, std::toupper(static_cast<unsigned char>(c))) : nullptr;
      if (!d) return -1;
      v = v * 16 + int(d - hex);
    }
    return v;
  }

  // Ids must be below kMaxVocabSize and fill a reasonable part of the id space: it is allocated densely.
  void check_id_space() {
    std::vector<bool> seen;  // grows with the ids seen, each below kMaxVocabSize (2 MB of bits at most)
    size_t distinct = 0;
    max_id_ = -1;
    auto note = [&](int id, const std::string& name) {
      if (id < 0 || id >= kMaxVocabSize) {
        fail(s_.source + ": token '" + name.substr(0, 40) + "' has id " + std::to_string(id) + "; ids must be in [0, " +
             std::to_string(kMaxVocabSize) + ") (larger is unsupported)");
      }
      if (size_t(id) >= seen.size()) seen.resize(std::max(size_t(id) + 1, 2 * seen.size()), false);
      distinct += !seen[id];
      seen[id] = true;
      max_id_ = std::max(max_id_, id);
    };
    for (const auto& [tok, id] : s_.vocab) note(id, tok);
    for (const AddedToken& a : s_.added) note(a.id, a.content);
    if (max_id_ < 0) fail(s_.source + " has an empty vocabulary (model.vocab and added_tokens)");
    const size_t limit = 2 * distinct + 1024;
    if (size_t(max_id_) + 1 > limit) {
      fail(s_.source + ": model.vocab / added_tokens use ids up to " + std::to_string(max_id_) + " for only " +
           std::to_string(distinct) + " distinct ids; an id space over twice the token count + 1024 (" +
           std::to_string(limit) + ") is unsupported");
    }
  }

  // The normalizers on one text segment; `at_start`: the segment starts the input.
  Piece normalize(std::string_view seg, bool at_start) const {
    Piece p{std::string(seg), at_start && !seg.empty() ? utf8_chars(seg).front().size() : 0};
    for (const NormalizerStep& n : s_.normalizers) {
      if (n.kind == NormalizerStep::prepend) {
        if (p.text.empty()) continue;
        p.text = n.text + p.text;
        if (p.origin_len > 0) p.origin_len += n.text.size();
        continue;
      }
      // Replace: each match becomes `text`, which takes the place (origin) of the match's last byte, or of the byte
      // before an empty match (the start, for an empty match at 0).
      Piece r;
      bool leading = true;
      auto emit = [&](std::string_view chunk, bool origin) {
        if (chunk.empty()) return;
        if (leading && origin) r.origin_len += chunk.size();
        else leading = false;
        r.text += chunk;
      };
      auto copy = [&](size_t b, size_t e) {
        const size_t mid = std::clamp(p.origin_len, b, e);
        emit(std::string_view(p.text).substr(b, mid - b), true);
        emit(std::string_view(p.text).substr(mid, e - mid), false);
      };
      size_t last = 0;
      for (auto [b, e] : n.pattern->find_all(p.text)) {
        copy(last, b);
        const bool origin = e > b ? e - 1 < p.origin_len : b == 0 ? at_start : b - 1 < p.origin_len;
        emit(n.text, origin);
        last = e;
      }
      copy(last, p.text.size());
      p = std::move(r);
    }
    return p;
  }

  // One pre-tokenizer step on every piece.
  std::vector<Piece> pre_tokenize(const PreTokenizerStep& st, const std::vector<Piece>& pieces) const {
    std::vector<Piece> out;
    for (const Piece& in : pieces) {
      if (st.kind == PreTokenizerStep::split) {
        for (auto [b, e] : apply_behavior(with_gaps(st.regex->find_all(in.text), in.text.size(), st.invert), st.behavior))
          out.push_back(slice(in, b, e));
      } else if (st.kind == PreTokenizerStep::byte_level) {
        Piece p = in;
        if (st.add_prefix_space && !p.text.empty() && p.text[0] != ' ') {
          p.text.insert(0, 1, ' ');
          if (p.origin_len > 0) ++p.origin_len;
        }
        std::vector<Piece> parts;
        if (st.regex) {
          const std::vector<Span> spans = with_gaps(st.regex->find_all(p.text), p.text.size(), false);
          for (auto [b, e] : apply_behavior(spans, SplitBehavior::isolated)) parts.push_back(slice(p, b, e));
        } else if (!p.text.empty()) {
          parts.push_back(std::move(p));
        }
        for (Piece& part : parts) {  // every byte becomes its printable character
          Piece m;
          for (size_t k = 0; k < part.text.size(); ++k) {
            const std::string& u = byte_map().to_unicode[static_cast<unsigned char>(part.text[k])];
            m.text += u;
            if (k < part.origin_len) m.origin_len += u.size();
          }
          out.push_back(std::move(m));
        }
      } else {
        metaspace(st, in, out);
      }
    }
    return out;
  }

  void metaspace(const PreTokenizerStep& st, const Piece& in, std::vector<Piece>& out) const {
    const std::string& rep = st.replacement;
    Piece p;
    for (size_t k = 0; k < in.text.size(); ++k) {
      const bool space = in.text[k] == ' ';
      p.text += space ? rep : std::string(1, in.text[k]);
      if (k < in.origin_len) p.origin_len += space ? rep.size() : 1;
    }
    const bool starts = p.text.compare(0, rep.size(), rep) == 0;
    if (!p.text.empty() && !starts &&
        (st.prepend == PreTokenizerStep::always || (st.prepend == PreTokenizerStep::first && p.origin_len > 0))) {
      p.text = rep + p.text;
      if (p.origin_len > 0) p.origin_len += rep.size();
    }
    if (!st.metaspace_split) {
      if (!p.text.empty()) out.push_back(std::move(p));
      return;
    }
    std::vector<std::pair<size_t, size_t>> reps;  // each replacement character is a match of its own
    for (size_t q = p.text.find(rep); q != std::string::npos; q = p.text.find(rep, q + rep.size()))
      reps.emplace_back(q, q + rep.size());
    for (auto [b, e] : apply_behavior(with_gaps(reps, p.text.size(), false), SplitBehavior::merged_with_next))
      out.push_back(slice(p, b, e));
  }

  // The BPE model on one piece, as Hugging Face's BPE::merge_word: one symbol per character; an unknown character
  // becomes its byte tokens (byte_fallback, only when all exist), else the unk token, else nothing.
  void encode_piece(const std::string& word, std::vector<int>& out) const {
    if (word.empty()) return;
    if (s_.ignore_merges) {
      if (auto it = s_.vocab.find(word); it != s_.vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int> ids;
    bool unk_pending = false;  // Hugging Face adds an unk when the next known character (or the end) comes
    for (std::string_view ch : utf8_chars(word)) {
      if (auto it = s_.vocab.find(std::string(ch)); it != s_.vocab.end()) {
        if (unk_pending) ids.push_back(unk_id_);
        unk_pending = false;
        ids.push_back(it->second);
        continue;
      }
      auto has_byte_token = [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; };
      if (s_.byte_fallback && std::all_of(ch.begin(), ch.end(), has_byte_token)) {
        for (unsigned char c : ch) ids.push_back(byte_ids_[c]);
        continue;
      }
      if (!s_.unk_token) continue;  // no unk token: the character is dropped, as Hugging Face does
      if (unk_pending && s_.fuse_unk) continue;
      if (unk_id_ < 0) {
        fail(s_.source + ": model.unk_token '" + *s_.unk_token + "' is not in model.vocab, and character '" +
             std::string(ch) + "' needs it");
      }
      if (unk_pending) ids.push_back(unk_id_);
      unk_pending = true;
    }
    if (unk_pending) ids.push_back(unk_id_);
    bpe_merge(ids, [&](int a, int b) -> std::optional<MergeCandidate> {
      auto it = merges_.find(key(a, b));
      if (it == merges_.end()) return std::nullopt;
      return MergeCandidate{double(it->second.first), it->second.second};
    });
    out.insert(out.end(), ids.begin(), ids.end());
  }

  BpeSpec s_;
  int max_id_ = -1;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_, added_;
  std::unordered_map<std::string, int> added_ids_;
  std::unordered_map<uint64_t, std::pair<int, int>> merges_;  // (left, right) -> (rank, merged id)
  int byte_ids_[256] = {};
  int unk_id_ = -1;
  AddedSet raw_, normalized_;  // added tokens matched on the raw text / on the normalized text
};

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

}  // namespace flashlite::engine
