#pragma once
// Generated tokens as the text a client receives. Pieces join as `flashlite generate` prints them (SentencePiece's
// dummy-prefix space dropped only right after BOS), and text is held back while it ends in an incomplete UTF-8
// character (byte-level BPE splits characters across tokens) or could still grow into a stop string, so that a
// stream never sends what a stop string later removes.
#include <string>
#include <vector>

#include "engine/tokenizer.h"

namespace flashlite::engine::server {

class TextStream {
 public:
  // prev_token: the prompt's last token (-1: none); bos: the BOS id (-1: none); stops: non-empty strings.
  TextStream(const Tokenizer& tok, int bos, int prev_token, std::vector<std::string> stops);
  // Adds a generated token; returns the text that may be sent now. After a stop string appears, stopped() is true
  // and the text before it is all that was ever returned.
  std::string push(int token);
  // The text still held back, at the end of a generation that did not stop on a stop string.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything returned so far

  // The bytes token `id` stands for (empty for ids past the tokenizer's vocabulary: padding the model never saw).
  static std::string piece_of(const Tokenizer& tok, int id);

 private:
  const Tokenizer& tok_;
  int bos_, prev_;
  std::vector<std::string> stops_;
  std::string pending_, text_;
  bool stopped_ = false;
};

// Bytes at the end of `s` that begin a UTF-8 character not yet complete (0..3).
size_t incomplete_utf8_tail(const std::string& s);

}  // namespace flashlite::engine::server
