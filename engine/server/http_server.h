#pragma once
// `flashlite serve`'s HTTP side (cpp-httplib): OpenAI's routes over the Scheduler, server-sent events for streams,
// the API key, body limit and errors as OpenAI-style JSON. Each connection runs on a pool thread that submits its
// request and then only waits on its RequestStream, so a slow or vanished client never holds up the batch.
#include <memory>
#include <string>

#include "engine/server/openai.h"
#include "engine/server/scheduler.h"

namespace httplib {
class Server;
}

namespace flashlite::engine::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (printed when listening)
  std::string api_key;                  // non-empty: /v1/* needs "Authorization: Bearer KEY"
  size_t max_body_bytes = 1 << 20;      // larger bodies get 413
  int threads = 64;                     // connections served at once (they wait on the scheduler, not the CPU)
  int write_timeout_s = 10;             // a reader this slow is dropped (its request cancelled)
};

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, ServedModel model, HttpOptions options);
  ~HttpServer();
  // Binds; returns the port (throws Error when it cannot bind).
  int bind();
  // Serves until stop(); returns when stopped.
  void serve();
  void stop();

 private:
  void routes();
  Scheduler& sched_;
  ServedModel model_;
  HttpOptions opt_;
  std::unique_ptr<httplib::Server> svr_;
};

}  // namespace flashlite::engine::server
