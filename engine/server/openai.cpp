#include "engine/server/openai.h"

#include <cmath>
#include <random>

#include "engine/server/text_stream.h"

namespace flashlite::engine::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
  throw ApiError{400, message, param, code};
}

std::string type_name(const json& v) { return v.type_name(); }

// The field, or null when absent or JSON null.
const json* get(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool bool_field(const json& body, const char* name, bool fallback) {
  const json* v = get(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

int64_t int_field(const json& body, const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const json* v = get(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad(name, std::string("'") + name + "' must be an integer, got " + type_name(*v) + " " + v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) bad(name, std::string("'") + name + "' is out of range");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    bad(name, std::string("'") + name + "' is " + std::to_string(x) + "; expected " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return x;
}

double number_field(const json& body, const char* name, double fallback) {
  const json* v = get(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, std::string("'") + name + "' must be a number, got " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x)) bad(name, std::string("'") + name + "' must be finite");
  return x;
}

std::string text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // content parts: only text
    std::string text;
    for (const json& part : content) {
      const json* type = part.is_object() ? get(part, "type") : nullptr;
      if (!type || *type != "text" || !get(part, "text") || !part["text"].is_string()) {
        bad(where, where + " has a content part that is not {\"type\": \"text\", \"text\": string}; only text is supported");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  bad(where, where + " must be a string or an array of text parts, got " + type_name(content));
}

std::vector<ChatMessage> messages_of(const json& body) {
  const json* m = get(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array()) bad("messages", "'messages' must be an array, got " + type_name(*m));
  if (m->empty()) bad("messages", "'messages' is empty; expected at least one message");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad(where, where + " must be an object, got " + type_name(msg));
    const json* role = get(msg, "role");
    if (!role || !role->is_string()) bad(where + ".role", where + ".role must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for system instructions
    if (r != "system" && r != "user" && r != "assistant") {
      bad(where + ".role", where + ".role '" + role->get<std::string>() + "' is not supported; expected system, developer, user or assistant");
    }
    const json* content = get(msg, "content");
    if (!content) bad(where + ".content", where + ".content is required");
    out.push_back({r, text_of(*content, where + ".content")});
  }
  return out;
}

// The prompts of a completions request: a string, token ids, or an array of either (a batch).
std::vector<std::vector<int>> prompts_of(const json& body, const ServedModel& m) {
  const json* p = get(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  auto from_text = [&](const std::string& text) {
    std::vector<int> ids;
    if (m.bos >= 0) ids.push_back(m.bos);  // as `flashlite generate` does
    for (int t : m.tokenizer->encode(text, false)) ids.push_back(t);
    return ids;
  };
  auto from_ids = [&](const json& a, const std::string& what) {  // token ids, used as given
    std::vector<int> ids;
    for (const json& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.vocab) {
        bad("prompt", what + " token " + t.dump() + " is not an id in [0, " + std::to_string(m.vocab) + ")");
      }
      ids.push_back(t.get<int>());
    }
    return ids;
  };
  const std::string shapes = "a string, token ids, or an array of strings or of token-id arrays";
  if (p->is_string()) return {from_text(p->get<std::string>())};
  if (!p->is_array() || p->empty()) {
    bad("prompt", "'prompt' must be " + shapes + ", got " + (p->is_array() ? "an empty array" : type_name(*p)));
  }
  if ((*p)[0].is_number_integer()) return {from_ids(*p, "'prompt'")};
  if (p->size() > size_t(kMaxPrompts)) {
    bad("prompt", "'prompt' holds " + std::to_string(p->size()) + " prompts; at most " + std::to_string(kMaxPrompts));
  }
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < p->size(); ++i) {
    const json& e = (*p)[i];
    const std::string what = "'prompt'[" + std::to_string(i) + "]";
    if (e.is_string()) out.push_back(from_text(e.get<std::string>()));
    else if (e.is_array() && !e.empty()) out.push_back(from_ids(e, what));
    else bad("prompt", what + " must be a string or a non-empty array of token ids, got " + type_name(e));
  }
  return out;
}

std::vector<std::string> stops_of(const json& body, int max_stop) {
  const json* s = get(body, "stop");
  std::vector<std::string> out;
  if (!s) return out;
  if (s->is_string()) {
    out.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    for (const json& x : *s) {
      if (!x.is_string()) bad("stop", "'stop' must hold strings, got " + type_name(x));
      out.push_back(x.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or an array of strings, got " + type_name(*s));
  }
  if (int(out.size()) > max_stop) bad("stop", "'stop' holds " + std::to_string(out.size()) + " strings; at most " + std::to_string(max_stop));
  for (const std::string& x : out) {
    if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  return out;
}

}  // namespace

std::string ApiError::type() const {
  if (status == 401) return "authentication_error";
  if (status == 404 && code == "model_not_found") return "invalid_request_error";
  if (status == 404) return "not_found_error";
  if (status == 413) return "invalid_request_error";
  if (status == 503) return "server_overloaded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type()},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ParsedRequest parse_request(const std::string& text, Endpoint endpoint, const ServedModel& m) {
  json body;
  try {
    body = json::parse(text);  // rejects invalid UTF-8 in strings too
  } catch (const json::exception& e) {  // a syntax error, or a number past a double's range (out_of_range)
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "the body must be a JSON object, got " + type_name(body));
  const json* model = get(body, "model");
  if (!model) bad("model", "'model' is required");
  if (!model->is_string()) bad("model", "'model' must be a string, got " + type_name(*model));
  if (model->get<std::string>() != m.name) {
    throw ApiError{404, "The model '" + model->get<std::string>() + "' does not exist; this server serves '" + m.name + "'",
                   "model", "model_not_found"};
  }
  ParsedRequest r;
  r.endpoint = endpoint;
  r.n = int(int_field(body, "n", 1, kMaxChoices, 1));
  r.stream = bool_field(body, "stream", false);
  if (const json* so = get(body, "stream_options")) {
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    r.include_usage = bool_field(*so, "include_usage", false);
  }
  GenerationRequest& g = r.gen;
  g.sampling.temperature = float(number_field(body, "temperature", 1.0));
  if (g.sampling.temperature < 0 || g.sampling.temperature > 2) {
    bad("temperature", "'temperature' is " + std::to_string(g.sampling.temperature) + "; expected 0 to 2 (0 = greedy)");
  }
  const double top_p = number_field(body, "top_p", 1.0);
  if (!(top_p > 0 && top_p <= 1)) bad("top_p", "'top_p' is " + std::to_string(top_p) + "; expected a number in (0, 1]");
  g.sampling.top_p = float(top_p);
  const int64_t top_k = int_field(body, "top_k", -1, int64_t(m.vocab), 0);
  g.sampling.top_k = top_k < 0 ? 0 : int(top_k);
  if (get(body, "seed")) {
    g.sampling.seed = uint64_t(int_field(body, "seed", INT64_MIN, INT64_MAX, 0));
  } else {
    std::random_device rd;
    g.sampling.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  // OpenAI's penalties: over the tokens this completion sampled so far (the server's Sampler accepts those only).
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    const double v = number_field(body, name, 0);
    if (!(v >= -2 && v <= 2)) bad(name, std::string("'") + name + "' is " + std::to_string(v) + "; expected -2 to 2");
    (name[0] == 'p' ? g.sampling.presence_penalty : g.sampling.frequency_penalty) = float(v);
  }
  g.sampling.repeat_penalty = 1.0f;
  g.sampling.repeat_last_n = -1;
  g.stop = stops_of(body, m.max_stop);
  g.ignore_eos = bool_field(body, "ignore_eos", false);

  if (endpoint == Endpoint::chat) {
    const bool logprobs = bool_field(body, "logprobs", false);
    const int64_t top = int_field(body, "top_logprobs", 0, 20, -1);
    if (top >= 0 && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    g.top_logprobs = logprobs ? int(std::max<int64_t>(top, 0)) : -1;
    r.prompts = {m.chat->conversation(messages_of(body))};
  } else {
    g.top_logprobs = int(int_field(body, "logprobs", 0, 5, -1));
    r.echo = bool_field(body, "echo", false);
    if (r.echo && g.top_logprobs >= 0) g.prompt_logprobs = g.top_logprobs;  // the prompt's tokens get them too
    if (const json* suffix = get(body, "suffix"); suffix && !(suffix->is_string() && suffix->get<std::string>().empty())) {
      bad("suffix", "'suffix' is not supported");
    }
    if (int_field(body, "best_of", 1, kMaxChoices, r.n) != r.n) {
      bad("best_of",
          "'best_of' must equal 'n' (" + std::to_string(r.n) + "): this server returns every choice it generates");
    }
    r.prompts = prompts_of(body, m);
  }
  if (r.prompts.size() * size_t(r.n) > size_t(kMaxSequences)) {
    bad("n", std::to_string(r.prompts.size()) + " prompts x 'n' " + std::to_string(r.n) + " = " +
                 std::to_string(r.prompts.size() * size_t(r.n)) + " sequences; at most " +
                 std::to_string(kMaxSequences));
  }
  // The longest prompt decides the room (and names itself in a batch).
  size_t longest = 0;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    if (r.prompts[i].empty()) bad("prompt", "the prompt has no tokens (and the model has no BOS token to start it)");
    if (r.prompts[i].size() > r.prompts[longest].size()) longest = i;
  }
  g.prompt = r.prompts[0];
  const int prompt_len = int(r.prompts[longest].size());
  const std::string which = endpoint == Endpoint::chat ? "messages"
                            : r.prompts.size() > 1 ? "prompt " + std::to_string(longest)
                                                   : "prompt";
  if (prompt_len >= m.context) {
    bad(endpoint == Endpoint::chat ? "messages" : "prompt",
        "This model's maximum context length is " + std::to_string(m.context) + " tokens. However, your " + which +
            " resulted in " + std::to_string(prompt_len) + " tokens, leaving no room for a completion.",
        "context_length_exceeded");
  }
  const int room = m.context - prompt_len;
  const char* max_name = get(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t asked = int_field(body, max_name, INT64_MIN, INT64_MAX, -1);
  if (get(body, max_name) && (asked < 0 || (asked == 0 && !r.echo))) {
    bad(max_name,
        std::string("'") + max_name + "' is " + std::to_string(asked) + "; expected at least 1 (0 with 'echo')");
  }
  if (asked > room) {
    // (asked may be near INT64_MAX: the sum saturates rather than overflow)
    const int64_t total = asked > INT64_MAX - prompt_len ? INT64_MAX : int64_t(prompt_len) + asked;
    bad(max_name,
        "This model's maximum context length is " + std::to_string(m.context) + " tokens. However, you requested " +
            std::to_string(total) + " tokens (" + std::to_string(prompt_len) + " in the " +
            which + ", " + std::to_string(asked) +
            " in the completion). Please reduce the length of the " +
            (endpoint == Endpoint::chat ? "messages" : "prompt") + " or completion.",
        "context_length_exceeded");
  }
  // Unset: the rest of the context for chat (OpenAI's "as many as fit"), 16 for completions (OpenAI's default).
  g.max_tokens = get(body, max_name) ? int(asked) : endpoint == Endpoint::chat ? room : std::min(16, room);
  return r;
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json chat_logprobs(const Tokenizer& tok, const std::vector<TokenEvent>& events) {
  json content = json::array();
  for (const TokenEvent& e : events) {
    if (e.prompt) continue;  // (a chat request has no echo: none come)
    json top = json::array();
    for (const TokenLogprob& t : e.top) {
      const std::string s = TextStream::piece_of(tok, t.id);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
    }
    const std::string s = TextStream::piece_of(tok, e.token);
    content.push_back({{"token", s}, {"logprob", e.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// The completions logprobs of `events` (generated tokens; prompt events are skipped), after those of the echoed
// prompt when `echo` (the first prompt token has none: null) given the prompt events.
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenEvent>& events, size_t text_offset,
                         const ResponseHead::EchoPrompt* echo = nullptr) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  if (echo) {
    std::vector<const TokenEvent*> scored;
    for (const TokenEvent& e : events) {
      if (e.prompt) scored.push_back(&e);
    }
    for (size_t i = 0; i < echo->ids.size(); ++i) {
      tokens.push_back(TextStream::piece_of(tok, echo->ids[i]));
      offsets.push_back(echo->offsets[i]);
      const TokenEvent* e = i >= 1 && i - 1 < scored.size() ? scored[i - 1] : nullptr;
      lps.push_back(e ? json(e->logprob) : json(nullptr));
      json top = e ? json::object() : json(nullptr);
      if (e) {
        for (const TokenLogprob& t : e->top) top[TextStream::piece_of(tok, t.id)] = t.logprob;
      }
      tops.push_back(top);
    }
  }
  for (const TokenEvent& e : events) {
    if (e.prompt) continue;
    const std::string s = TextStream::piece_of(tok, e.token);
    tokens.push_back(s);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const TokenLogprob& t : e.top) top[TextStream::piece_of(tok, t.id)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += e.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string joined_text(const std::vector<TokenEvent>& events) {
  std::string t;
  for (const TokenEvent& e : events) t += e.text;  // (prompt events have none)
  return t;
}

}  // namespace

json usage_json(const std::vector<const RequestStream*>& done, int n) {
  int prompt = 0, completion = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    if (i % size_t(n) == 0) prompt += done[i]->prompt_tokens;
    completion += done[i]->completion_tokens;
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json full_response(const ResponseHead& h, const Tokenizer& tok, const std::vector<ChoiceResult>& choices) {
  const bool chat = h.endpoint == Endpoint::chat;
  json out = json::array();
  std::vector<const RequestStream*> done;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", c.done->finish_reason}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", joined_text(c.events)}};
    const ResponseHead::EchoPrompt* echo = h.echo_of(i);
    if (!chat) choice["text"] = (echo ? echo->text : std::string()) + joined_text(c.events);
    choice["logprobs"] = !h.logprobs ? json(nullptr)
                         : chat      ? chat_logprobs(tok, c.events)
                                     : completion_logprobs(tok, c.events, echo ? echo->text.size() : 0, echo);
    out.push_back(std::move(choice));
    done.push_back(c.done);
  }
  return {{"id", h.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(out)},
          {"usage", usage_json(done, h.n)}};
}

void set_echo(ResponseHead& h, const Tokenizer& tok, int bos, const std::vector<std::vector<int>>& prompts) {
  h.echo = true;
  h.echo_prompts.clear();
  for (const std::vector<int>& prompt : prompts) {
    ResponseHead::EchoPrompt& e = h.echo_prompts.emplace_back();
    e.ids = prompt;
    size_t first = 0;  // BOS has no text: the dummy-prefix space after it goes, as in generated text
    if (!prompt.empty() && bos >= 0 && prompt[0] == bos) first = 1, e.offsets.push_back(0);
    TextStream text(tok, bos, first ? bos : -1, {});
    for (size_t i = first; i < prompt.size(); ++i) {
      e.offsets.push_back(e.text.size());
      e.text += text.push(prompt[i]);
    }
    e.text += text.flush();
  }
}

json echo_chunk(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& prompt, int index) {
  const ResponseHead::EchoPrompt& e = *h.echo_of(size_t(index));
  json chunk = stream_chunk(h, tok, {}, nullptr, false, 0, index);  // a completions chunk, its text the prompt's
  json& choice = chunk["choices"][0];
  choice["text"] = e.text;
  if (h.logprobs) choice["logprobs"] = completion_logprobs(tok, prompt, e.text.size(), &e);
  return chunk;
}

json stream_chunk(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& events,
                  const RequestStream* done, bool first, size_t text_offset, int index) {
  const bool chat = h.endpoint == Endpoint::chat;
  json choice = {{"index", index}, {"finish_reason", done ? json(done->finish_reason) : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    const std::string text = joined_text(events);
    if (!text.empty() || (first && !done)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = joined_text(events);
  }
  // With logprobs asked for, a chunk that only ends the stream still carries them (empty), so that a client
  // concatenating every chunk's logprobs never meets a null.
  choice["logprobs"] = !h.logprobs ? json(nullptr)
                       : chat      ? chat_logprobs(tok, events)
                                   : completion_logprobs(tok, events, text_offset);
  return {{"id", h.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", json::array({choice})}};
}

}  // namespace flashlite::engine::server
