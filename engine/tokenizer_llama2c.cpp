// llama2.c tokenizer .bin: int32 max_token_length, then per token: float32 score, int32 byte length, bytes. Every
// field is checked against the bytes left in the file before it is read or anything is sized by it.
// Encoding is SentencePiece BPE: a dummy-prefix space, one symbol per UTF-8 character (unknown characters fall back
// to <0xXX> byte tokens when the vocabulary has them, else to <unk> = 0), then repeatedly merge the adjacent pair
// whose concatenation is the highest-scoring piece (leftmost on ties).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "engine/bpe_merge.h"
#include "engine/errors.h"
#include "engine/mapped_file.h"
#include "engine/tokenizer.h"

namespace flashlite::engine {

namespace {

constexpr int32_t kMaxPieceBytes = 4096;  // max_token_length above this is a corrupt header

class Llama2cTokenizer final : public Tokenizer {
 public:
  explicit Llama2cTokenizer(const std::string& path) {
    MappedFile f(path);
    const std::string where = "llama2.c tokenizer '" + path + "'";
    const uint8_t* data = f.data();
    const size_t size = f.size();
    // Every read goes through `take`, which checks the bytes left first (no arithmetic that could wrap).
    size_t off = 0;
    auto take = [&](void* dst, size_t n, const char* what) {
      if (n > size - off) {
        const std::string field = off < 4 ? what : "token " + std::to_string(pieces_.size()) + "'s " + what;
        fail(where + " is truncated: " + field + " needs " + std::to_string(n) + " bytes at offset " +
             std::to_string(off) + ", " + std::to_string(size - off) + " left (corrupt or truncated)");
      }
      std::memcpy(dst, data + off, n);
      off += n;
    };
    int32_t max_len = 0;
    take(&max_len, 4, "max_token_length header");
    if (max_len <= 0 || max_len > kMaxPieceBytes) {
      fail(where + " has max_token_length " + std::to_string(max_len) + "; expected 1.." + std::to_string(kMaxPieceBytes));
    }
    const size_t max_tokens = std::min<size_t>((size - off) / 8, size_t(kMaxVocabSize));  // 8 header bytes per token
    pieces_.reserve(max_tokens);
    scores_.reserve(max_tokens);
    while (off < size) {
      if (pieces_.size() >= size_t(kMaxVocabSize)) {
        fail(where + " holds more than " + std::to_string(kMaxVocabSize) + " tokens (larger is unsupported)");
      }
      float score;
      int32_t len;
      take(&score, 4, "score");
      take(&len, 4, "length");
      if (std::isnan(score)) fail(where + " token " + std::to_string(pieces_.size()) + " has a NaN score");
      if (len < 0 || len > max_len || size_t(len) > size - off) {
        fail(where + " token " + std::to_string(pieces_.size()) + " has length " + std::to_string(len) +
             "; expected 0.." + std::to_string(max_len) + " (max_token_length) within the " +
             std::to_string(size - off) + " bytes left (corrupt or truncated)");
      }
      pieces_.emplace_back(reinterpret_cast<const char*>(data + off), size_t(len));
      scores_.push_back(score);
      off += size_t(len);
    }
    if (pieces_.size() < 3) fail(where + " has " + std::to_string(pieces_.size()) + " tokens; expected at least 3 (<unk>, <s>, </s>)");
    for (int i = int(pieces_.size()) - 1; i >= 3; --i) lookup_[pieces_[i]] = i;  // first id wins on duplicates
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = lookup_.find(name);
      byte_ids_[b] = it == lookup_.end() ? -1 : it->second;
      has_byte_fallback_ = has_byte_fallback_ || byte_ids_[b] >= 0;
    }
    if (auto it = lookup_.find(" "); it != lookup_.end()) space_id_ = it->second;
  }

  std::vector<int> encode(std::string_view text, bool parse_special) const override {
    std::vector<int> out;
    if (!parse_special) {
      encode_text(text, out);
      return out;
    }
    // Control tokens written as <unk>, <s>, </s> become their ids; text between them is encoded normally.
    static const std::pair<std::string_view, int> kControls[] = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    size_t start = 0, i = 0;
    while (i < text.size()) {
      bool matched = false;
      for (auto [s, id] : kControls) {
        if (text.compare(i, s.size(), s) == 0) {
          encode_text(text.substr(start, i - start), out);
          out.push_back(id);
          i += s.size();
          start = i;
          matched = true;
          break;
        }
      }
      if (!matched) ++i;
    }
    encode_text(text.substr(start), out);
    return out;
  }

  std::string decode_token(int id) const override {
    check_id(id);
    if (id < 3) return "";  // <unk>, <s>, </s>: control tokens carry no text
    const std::string& p = pieces_[id];
    if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>') {
      for (int b = 0; b < 256; ++b)
        if (byte_ids_[b] == id) return std::string(1, char(b));
    }
    return p;
  }

  int vocab_size() const override { return int(pieces_.size()); }
  std::optional<int> token_id(std::string_view token) const override {
    if (token == "<unk>") return 0;
    if (token == "<s>") return 1;
    if (token == "</s>") return 2;
    auto it = lookup_.find(std::string(token));
    if (it == lookup_.end()) return std::nullopt;
    return it->second;
  }
  bool is_special(int id) const override { return id >= 0 && id < 3; }
  std::string kind() const override {
    return std::string("llama2.c sentencepiece-bpe (") + (has_byte_fallback_ ? "byte fallback" : "no byte fallback") + ")";
  }
  int bos_id() const override { return 1; }
  bool adds_dummy_prefix() const override { return space_id_ >= 0; }

 private:
  void encode_text(std::string_view text, std::vector<int>& out) const {
    if (text.empty()) return;
    std::vector<int> ids;
    if (space_id_ >= 0) ids.push_back(space_id_);  // SentencePiece's dummy prefix, per text segment
    for (std::string_view ch : utf8_chars(text)) {
      auto it = lookup_.find(std::string(ch));
      if (it != lookup_.end()) {
        ids.push_back(it->second);
      } else if (std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
        for (unsigned char b : ch) ids.push_back(byte_ids_[b]);  // byte fallback, when every byte has its token
      } else if (ids.empty() || ids.back() != 0) {
        ids.push_back(0);  // <unk>; a run of unknown characters is one <unk>, as SentencePiece does
      }
    }
    std::string buf;
    bpe_merge(ids, [&](int a, int b) -> std::optional<MergeCandidate> {
      if (a < 3 || b < 3) return std::nullopt;
      buf.assign(pieces_[a]).append(pieces_[b]);
      auto it = lookup_.find(buf);
      if (it == lookup_.end()) return std::nullopt;
      return MergeCandidate{-double(scores_[it->second]), it->second};
    });
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
  int byte_ids_[256];  // -1: no <0xXX> piece for that byte
  bool has_byte_fallback_ = false;
  int space_id_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path) {
  return std::make_unique<Llama2cTokenizer>(path);
}

}  // namespace flashlite::engine
