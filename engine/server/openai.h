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

struct ParsedRequest {
  Endpoint endpoint = Endpoint::chat;
  GenerationRequest gen;
  bool stream = false, include_usage = false;
};

// Throws ApiError.
ParsedRequest parse_request(const std::string& body, Endpoint endpoint, const ServedModel& model);

// Response pieces. `id` like "chatcmpl-..."; `created` Unix seconds.
struct ResponseHead {
  Endpoint endpoint = Endpoint::chat;
  std::string id, model;
  int64_t created = 0;
  bool logprobs = false;  // the request asked for them
};
// The whole (non-streamed) response.
json full_response(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& events,
                   const RequestStream& done);
// One stream chunk: the text of `events` (and their logprobs), and finish_reason when `done` is given; text_offset:
// the completion text sent before it (completions' logprobs count offsets from the start).
json stream_chunk(const ResponseHead& h, const Tokenizer& tok, const std::vector<TokenEvent>& events,
                  const RequestStream* done, bool first, size_t text_offset = 0);
json usage_json(const RequestStream& done);

}  // namespace flashlite::engine::server
