#include "engine/tokenizer_bpe.h"

#include <algorithm>
#include <array>

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

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec) : s_(std::move(spec)) {
    int max_id = -1;
    for (const auto& [tok, id] : s_.vocab) max_id = std::max(max_id, id);
    for (const AddedToken& a : s_.added) max_id = std::max(max_id, a.id);
    if (max_id < 0) fail(s_.source + " has an empty vocabulary");
    id_to_token_.resize(size_t(max_id) + 1);
    for (const auto& [tok, id] : s_.vocab) {
      if (id < 0) fail(s_.source + ": token '" + tok + "' has negative id " + std::to_string(id));
      id_to_token_[id] = tok;
    }
    special_.assign(size_t(max_id) + 1, false);
    for (const AddedToken& a : s_.added) {
      if (a.id < 0 || a.content.empty()) fail(s_.source + ": an added token has an empty content or negative id");
      id_to_token_[a.id] = a.content;
      added_ids_[a.content] = a.id;
      added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
      if (a.special) special_[a.id] = true;
    }
    merges_.reserve(s_.merges.size() * 2);
    for (size_t r = 0; r < s_.merges.size(); ++r) {
      const auto& [a, b] = s_.merges[r];
      auto ia = s_.vocab.find(a), ib = s_.vocab.find(b), im = s_.vocab.find(a + b);
      if (ia == s_.vocab.end() || ib == s_.vocab.end() || im == s_.vocab.end()) {
        fail(s_.source + ": merge " + std::to_string(r) + " ('" + a + "' '" + b +
             "') names a token that is not in the vocabulary");
      }
      merges_.try_emplace(key(ia->second, ib->second), int(r), im->second);
    }
    for (int b = 0; b < 256 && s_.byte_fallback; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = s_.vocab.find(name);
      byte_ids_[b] = it == s_.vocab.end() ? -1 : it->second;
    }
  }

  std::vector<int> encode(std::string_view text, bool parse_special) const override {
    std::vector<int> out;
    size_t start = 0, i = 0;
    bool strip_next_left = false;
    auto flush_text = [&](std::string_view seg, bool strip_right) {
      if (strip_next_left) while (!seg.empty() && is_space(seg.front())) seg.remove_prefix(1);
      if (strip_right) while (!seg.empty() && is_space(seg.back())) seg.remove_suffix(1);
      encode_segment(seg, out);
    };
    while (i < text.size()) {
      if (!added_first_byte_[static_cast<unsigned char>(text[i])]) {  // no added token starts with this byte
        ++i;
        continue;
      }
      const AddedToken* best = nullptr;
      for (const AddedToken& a : s_.added) {  // leftmost-longest match among the allowed added tokens
        if ((a.special && !parse_special) || text.compare(i, a.content.size(), a.content) != 0) continue;
        if (!best || a.content.size() > best->content.size()) best = &a;
      }
      if (!best) {
        ++i;
        continue;
      }
      flush_text(text.substr(start, i - start), best->lstrip);
      out.push_back(best->id);
      i += best->content.size();
      start = i;
      strip_next_left = best->rstrip;
    }
    flush_text(text.substr(start), false);
    return out;
  }

  std::string decode_token(int id) const override {
    check_id(id);
    const std::string& t = id_to_token_[id];
    if (special_[id] || added_ids_.count(t)) return t;
    if (s_.byte_level) {
      std::string out;
      for (std::string_view ch : utf8_chars(t)) {
        auto it = byte_map().to_byte.find(std::string(ch));
        if (it != byte_map().to_byte.end()) out += char(it->second);
        else out += ch;
      }
      return out;
    }
    if (s_.decode_metaspace) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        return std::string(1, char(std::stoi(t.substr(3, 2), nullptr, 16)));
      }
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
    return std::string(s_.byte_level ? "byte-level bpe" : "bpe") + " (" + std::to_string(s_.vocab.size()) + " tokens, " +
           std::to_string(s_.merges.size()) + " merges, " + std::to_string(s_.added.size()) + " added)";
  }
  int bos_id() const override { return s_.bos_id; }
  bool adds_dummy_prefix() const override { return s_.decode_strip_first_space; }

 private:
  static uint64_t key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::string normalize(std::string_view seg) const {
    std::string s(seg);
    for (const NormalizerStep& n : s_.normalizers) {
      if (n.kind == NormalizerStep::prepend) {
        if (!s.empty()) s = n.a + s;
      } else if (!n.a.empty()) {
        std::string r;
        for (size_t p = 0; p < s.size();) {
          if (s.compare(p, n.a.size(), n.a) == 0) {
            r += n.b;
            p += n.a.size();
          } else {
            r += s[p++];
          }
        }
        s = std::move(r);
      }
    }
    return s;
  }

  // Applies one pre-tokenizer step to every piece.
  std::vector<std::string> apply(const PreTokenizerStep& st, std::vector<std::string> pieces, bool first_segment) const {
    std::vector<std::string> out;
    for (size_t pi = 0; pi < pieces.size(); ++pi) {
      std::string& p = pieces[pi];
      if (st.kind == PreTokenizerStep::metaspace) {
        std::string r;
        for (char c : p) r += c == ' ' ? st.replacement : std::string(1, c);
        const bool prefix = st.add_prefix_space && (!st.prefix_first_only || (first_segment && pi == 0));
        if (prefix && r.compare(0, st.replacement.size(), st.replacement) != 0) r = st.replacement + r;
        if (!st.metaspace_split) {
          out.push_back(std::move(r));
          continue;
        }
        size_t b = 0;  // split before every replacement char (it starts the next piece)
        for (size_t q = 1; q <= r.size(); ++q) {
          if (q == r.size() || r.compare(q, st.replacement.size(), st.replacement) == 0) {
            if (q > b) out.push_back(r.substr(b, q - b));
            b = q;
          }
        }
        continue;
      }
      if (st.kind == PreTokenizerStep::byte_level && st.add_prefix_space && !p.empty() && p[0] != ' ') p = " " + p;
      if (!st.regex) {
        out.push_back(std::move(p));
        continue;
      }
      size_t last = 0;
      for (auto [b, e] : st.regex->find_all(p)) {
        const bool keep_gap = !st.remove_matches || st.invert, keep_match = !st.remove_matches || !st.invert;
        if (b > last && keep_gap) out.push_back(p.substr(last, b - last));
        if (keep_match) out.push_back(p.substr(b, e - b));
        last = e;
      }
      if (last < p.size() && (!st.remove_matches || st.invert)) out.push_back(p.substr(last));
    }
    return out;
  }

  void encode_segment(std::string_view seg, std::vector<int>& out) const {
    if (seg.empty()) return;
    std::vector<std::string> pieces{normalize(seg)};
    for (const PreTokenizerStep& st : s_.pre_tokenizers) pieces = apply(st, std::move(pieces), out.empty());
    for (const std::string& p : pieces) encode_piece(p, out);
  }

  void encode_piece(const std::string& raw, std::vector<int>& out) const {
    if (raw.empty()) return;
    std::string word;
    if (s_.byte_level) {
      for (unsigned char c : raw) word += byte_map().to_unicode[c];
    } else {
      word = raw;
    }
    if (s_.ignore_merges) {
      if (auto it = s_.vocab.find(word); it != s_.vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int> ids;
    bool prev_unk = false;
    for (std::string_view ch : utf8_chars(word)) {
      auto it = s_.vocab.find(std::string(ch));
      const bool unk = it == s_.vocab.end() && !(s_.byte_fallback && byte_ids_[static_cast<unsigned char>(ch[0])] >= 0);
      if (it != s_.vocab.end()) {
        ids.push_back(it->second);
      } else if (!unk) {
        for (unsigned char c : ch) ids.push_back(byte_ids_[c]);
      } else if (s_.unk_id >= 0) {
        if (!(s_.fuse_unk && prev_unk)) ids.push_back(s_.unk_id);
      } else {
        fail(s_.source + ": character '" + std::string(ch) + "' is not in the vocabulary and there is no unk token");
      }
      prev_unk = unk;
    }
    bpe_merge(ids, [&](int a, int b) -> std::optional<MergeCandidate> {
      auto it = merges_.find(key(a, b));
      if (it == merges_.end()) return std::nullopt;
      return MergeCandidate{double(it->second.first), it->second.second};
    });
    out.insert(out.end(), ids.begin(), ids.end());
  }

  BpeSpec s_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;
  std::unordered_map<std::string, int> added_ids_;
  std::unordered_map<uint64_t, std::pair<int, int>> merges_;  // (left, right) -> (rank, merged id)
  int byte_ids_[256] = {};
  bool added_first_byte_[256] = {};
};

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

}  // namespace flashlite::engine
