#include "engine/server/text_stream.h"

#include <algorithm>

namespace flashlite::engine::server {

size_t incomplete_utf8_tail(const std::string& s) {
  // Look back over at most 3 continuation bytes for the lead byte of the last character.
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;  // stray continuation bytes: invalid, sent as they are (the JSON writer replaces them)
}

TextStream::TextStream(const Tokenizer& tok, int bos, int prev_token, std::vector<std::string> stops)
    : tok_(tok), bos_(bos), prev_(prev_token), stops_(std::move(stops)) {}

std::string TextStream::piece_of(const Tokenizer& tok, int id) {
  return id >= 0 && id < tok.vocab_size() ? tok.decode_token(id) : std::string();
}

std::string TextStream::push(int token) {
  if (stopped_) return "";
  std::string piece = piece_of(tok_, token);
  if (prev_ == bos_ && bos_ >= 0 && tok_.adds_dummy_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  prev_ = token;
  pending_ += piece;
  // Earliest stop string in what was not sent (held-back text covers any stop string that started earlier).
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    text_ += out;
    return out;
  }
  // Hold back the longest tail that a stop string starts with, and an unfinished character.
  size_t hold = incomplete_utf8_tail(pending_);
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, out.size());
  text_ += out;
  return out;
}

std::string TextStream::flush() {
  std::string out;
  out.swap(pending_);
  if (stopped_) return "";
  text_ += out;
  return out;
}

}  // namespace flashlite::engine::server
