#include "engine/chat_template.h"

namespace flashlite::engine {

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

ChatFormatter::ChatFormatter(const Tokenizer& tok, int bos_id, std::string system)
    : tok_(tok), bos_(bos_id), system_(std::move(system)) {
  auto sh = tok.token_id("<|start_header_id|>"), eh = tok.token_id("<|end_header_id|>"), eot = tok.token_id("<|eot_id|>");
  if (sh && eh && eot) {
    llama3_ = true;
    start_header_ = *sh;
    end_header_ = *eh;
    eot_ = *eot;
  }
}

std::vector<int> ChatFormatter::header(const std::string& role) const {
  std::vector<int> ids{start_header_};
  for (int t : tok_.encode(role, false)) ids.push_back(t);
  ids.push_back(end_header_);
  return ids;
}

std::vector<int> ChatFormatter::user_turn(const std::string& message, bool first) const {
  std::vector<int> ids;
  auto append = [&](const std::vector<int>& v) { ids.insert(ids.end(), v.begin(), v.end()); };
  if (first && bos_ >= 0) ids.push_back(bos_);
  if (!llama3_) {
    append(tok_.encode(message, false));
    return ids;
  }
  if (first && !trim(system_).empty()) {
    append(header("system"));
    append(tok_.encode("\n\n" + trim(system_), false));
    ids.push_back(eot_);
  }
  append(header("user"));
  append(tok_.encode("\n\n" + trim(message), false));
  ids.push_back(eot_);
  append(header("assistant"));
  append(tok_.encode("\n\n", false));
  return ids;
}

std::vector<int> ChatFormatter::conversation(const std::vector<ChatMessage>& messages) const {
  std::vector<int> ids;
  auto append = [&](const std::vector<int>& v) { ids.insert(ids.end(), v.begin(), v.end()); };
  if (bos_ >= 0) ids.push_back(bos_);
  if (!llama3_) {
    std::string text;
    for (const ChatMessage& m : messages) text += (text.empty() ? "" : "\n") + m.content;
    append(tok_.encode(text, false));
    return ids;
  }
  for (const ChatMessage& m : messages) {
    append(header(m.role));
    append(tok_.encode("\n\n" + trim(m.content), false));
    ids.push_back(eot_);
  }
  append(header("assistant"));
  append(tok_.encode("\n\n", false));
  return ids;
}

}  // namespace flashlite::engine
