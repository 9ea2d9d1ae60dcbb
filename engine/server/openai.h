#pragma once
// OpenAI's request and response shapes for /v1/chat/completions and /v1/completions: a request body validated into a
// GenerationRequest (every problem an ApiError naming the field, the value and what was expected), and the JSON of
// responses, stream chunks and errors.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/chat_template.h"
#include "engine/server/scheduler.h"
#include "engine/tokenizer.h"

namespace flashlite::engine::server {

using json = nlohmann::json;

// An error answered to the client as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "model_not_found", "context_length_exceeded", or empty
  std::string type() const;  // invalid_request_error, authentication_error, server_error, ...
};
json error_json(const ApiError& e);

// What requests are checked against.
struct ServedModel {
  std::string name;  // the `model` requests must name
  const Tokenizer* tokenizer = nullptr;
  const ChatFormatter* chat = nullptr;
  int bos = -1;
  int context = 0;        // positions per sequence
  int vocab = 0;          // the model's
  int max_stop = 4;       // stop strings per request (OpenAI's limit)
};

enum class Endpoint { chat, completions };

// Choices a request may ask for per prompt ('n'; OpenAI's limit), prompts a completions request may hold, and
// sequences (prompts x n) in all. Each is a sequence of its own in the batch: prompt p's choice i, index p n + i,
// sampled with the request's seed + i.
inline constexpr int kMaxChoices = 128, kMaxPrompts = 256, kMaxSequences = 1024;

struct ParsedRequest {
  Endpoint endpoint = Endpoint::chat;
  GenerationRequest gen;  // prompt 0's choice 0; the others differ in their prompt and seed (gen.sampling.seed + i)
  std::vector<std::vector<int>> prompts;  // one, or (completions) the prompts of a batch
  int n = 1;
  bool stream = false, include_usage = false;
  bool echo = false;  // completions: the prompt returned before the text (with logprobs: its tokens' too)
};

// Throws ApiError.
ParsedRequest parse_request(const std::string& body, Endpoint endpoint, const ServedModel& model);

// Response pieces. `id` like "chatcmpl-..."; `created` Unix seconds.
struct ResponseHead {
  Endpoint endpoint = Endpoint::chat;
  std::string id, model;
  int64_t created = 0;
  bool logprobs = false;  // the request asked for them
  int n = 1;              // choices per prompt: choice c answers prompt c / n
  // Completions with echo (set_echo): per prompt, its tokens, its text as generated text reads (TextStream) and each
  // token's offset in it.
  struct EchoPrompt {
    std::vector<int> ids;
    std::string text;
    std::vector<size_t> offsets;
  };
  bool echo = false;
  std::vector<EchoPrompt> echo_prompts;
  const EchoPrompt* echo_of(size_t choice) const { return echo ? &echo_prompts[choice / size_t(n)] : nullptr; }
};
void set_echo(ResponseHead& h, const Tokenizer& tok, int bos, const std::vector<std::vector<int>>& prompts);
// One choice of a finished request: its events and its ended stream.
struct ChoiceResult {
  std::vector<TokenEvent> events;
  const RequestStream* done = nullptr;
};
// The whole (non-streamed) response, choice i at index i.
json full_response(const ResponseHead& h, const Tokenizer& tok, const std::vector<ChoiceResult>& choices);
// One stream chunk of choice `index`: the text of `events` (and their logprobs), and finish_reason when `done` is
// given; text_offset: the choice's text sent before it (completions' logprobs count offsets from the start). With
// echo, a choice's first chunk (echo_chunk) is the prompt, with its tokens' logprobs (`prompt`: the prompt events).
json stream_chunk(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& events,
                  const RequestStream* done, bool first, size_t text_offset = 0, int index = 0);
json echo_chunk(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& prompt, int index);
// The request's usage over its ended choices (n per prompt): each prompt once, every choice's completion tokens.
json usage_json(const std::vector<const RequestStream*>& done, int n);

}  // namespace flashlite::engine::server
