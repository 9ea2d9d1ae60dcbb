#pragma once
// Chat turns as token ids. Llama 3 format when the tokenizer has its header/eot tokens:
//   <|begin_of_text|>[<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>]
//   <|start_header_id|>user<|end_header_id|>\n\n{message}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n
// (contents trimmed, as the template's `| trim`). Otherwise a plain continuation: BOS once, then the text of each turn.
// Text is never parsed for special tokens, so a message cannot inject "<|eot_id|>".
#include <string>
#include <vector>

#include "engine/tokenizer.h"

namespace flashlite::engine {

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

class ChatFormatter {
 public:
  ChatFormatter(const Tokenizer& tok, int bos_id, std::string system);
  // The tokens to append for this turn; `first` (the conversation is empty, e.g. ChatSession::empty()) adds BOS and
  // the system prompt. Taken from the caller, not remembered, so a turn that fails does not desynchronize it.
  std::vector<int> user_turn(const std::string& message, bool first) const;
  // A whole conversation (the server's chat completions), ending with the assistant's header: BOS, then each message
  // as a turn of its role (contents trimmed). Plain continuation: BOS, then the contents joined by newlines.
  std::vector<int> conversation(const std::vector<ChatMessage>& messages) const;
  bool llama3() const { return llama3_; }
  std::string description() const { return llama3_ ? "Llama 3 chat template" : "plain continuation"; }

 private:
  std::vector<int> header(const std::string& role) const;
  const Tokenizer& tok_;
  int bos_;
  std::string system_;
  bool llama3_ = false;
  int start_header_ = -1, end_header_ = -1, eot_ = -1;
};

std::string trim(const std::string& s);

}  // namespace flashlite::engine
