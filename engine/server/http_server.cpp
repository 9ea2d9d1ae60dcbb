#include "engine/server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>

#include "engine/errors.h"

namespace flashlite::engine::server {

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(error_json(e)), "application/json");
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%llx%06llx", prefix, (unsigned long long)std::time(nullptr),
                (unsigned long long)(++counter & 0xFFFFFF));
  return buf;
}

// httplib listens with a backlog of 5 (a compile-time setting of Debian's library): a burst of clients past it sees
// dropped or reset connections. listen() again on the bound socket widens the queue.
class Listener final : public httplib::Server {
 public:
  void widen_backlog(int backlog) {
    if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, backlog);
  }
};

// Ends a request's choices when its HTTP side goes away before they finished (disconnect, write timeout, exception,
// or a later choice that could not be queued); a finished stream ignores the cancel.
struct CancelAllOnExit {
  std::shared_ptr<std::vector<std::shared_ptr<RequestStream>>> streams;
  ~CancelAllOnExit() {
    if (streams) {
      for (const auto& st : *streams) st->cancel();
    }
  }
};

}  // namespace

HttpServer::HttpServer(Scheduler& scheduler, ServedModel model, HttpOptions options)
    : sched_(scheduler), model_(std::move(model)), opt_(std::move(options)), svr_(std::make_unique<Listener>()) {
  const int threads = std::max(4, opt_.threads);
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr_->set_payload_max_length(opt_.max_body_bytes);
  svr_->set_write_timeout(opt_.write_timeout_s, 0);
  svr_->set_keep_alive_timeout(5);
  // httplib's default adds SO_REUSEPORT, which lets a second server share a port in use; only SO_REUSEADDR here (a
  // restart may bind at once while old connections linger).
  svr_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = opt_.port == 0 ? svr_->bind_to_any_port(opt_.host) : (svr_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) fail("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) + " (in use, or not an address of this machine)");
  static_cast<Listener&>(*svr_).widen_backlog(std::max(128, opt_.threads));
  return port;
}

void HttpServer::serve() { svr_->listen_after_bind(); }

void HttpServer::stop() { svr_->stop(); }

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  using HR = httplib::Server::HandlerResponse;

  svr_->set_pre_routing_handler([this](const Request& req, Response& res) {
    if (opt_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return HR::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt_.api_key) return HR::Unhandled;
    send_error(res, {401, "Missing or wrong API key: send 'Authorization: Bearer KEY' with the key the server was started with",
                     "", "invalid_api_key"});
    return HR::Handled;
  });
  // Errors httplib answers itself (unknown route, body too large, unreadable request) get OpenAI's JSON too.
  svr_->set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return HR::Unhandled;  // ours, already JSON
    ApiError e{res.status, "", "", ""};
    if (res.status == 404) e.message = "No route " + req.method + " " + req.path;
    else if (res.status == 413) e.message = "The request body is too large", e.param = "", e.code = "request_too_large";
    else e.message = "HTTP error " + std::to_string(res.status) + " (the request could not be read)";
    send_error(res, e);
    return HR::Handled;
  }));
  svr_->set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, "internal error: " + what, "", ""});
  });

  svr_->Get("/health", [](const Request&, Response& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); });
  svr_->Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(sched_.metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  svr_->Get("/v1/models", [this](const Request&, Response& res) {
    const json m = {{"id", model_.name}, {"object", "model"}, {"created", 0}, {"owned_by", "flashlite"},
                    {"max_model_len", model_.context}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });

  auto completion = [this](Endpoint endpoint) {
    return [this, endpoint](const Request& req, Response& res) {
      ParsedRequest p;
      // One stream per choice: prompt p's choice i (index p n + i) is a sequence of its own with the request's
      // seed + i. If a later one cannot be queued, the earlier ones are cancelled (the guard) and the request is
      // answered whole.
      auto streams = std::make_shared<std::vector<std::shared_ptr<RequestStream>>>();
      CancelAllOnExit guard{streams};
      bool logprobs = false;
      try {
        p = parse_request(req.body, endpoint, model_);
        logprobs = p.gen.top_logprobs >= 0;
        for (const std::vector<int>& prompt : p.prompts) {
          for (int i = 0; i < p.n; ++i) {
            GenerationRequest g = p.gen;
            g.prompt = prompt;
            g.sampling.seed += uint64_t(i);
            streams->push_back(sched_.submit(std::move(g)));
          }
        }
      } catch (const ApiError& e) {
        return send_error(res, e);
      } catch (const QueueFull& e) {
        return send_error(res, {503, std::string("The server is busy: ") + e.what(), "", "queue_full"});
      } catch (const Error& e) {
        return send_error(res, {400, e.what(), "", ""});
      }
      ResponseHead head;
      head.endpoint = endpoint;
      head.id = new_id(endpoint == Endpoint::chat ? "chatcmpl" : "cmpl");
      head.model = model_.name;
      head.created = int64_t(std::time(nullptr));
      head.logprobs = logprobs;
      head.n = p.n;
      if (p.echo) set_echo(head, *model_.tokenizer, model_.bos, p.prompts);
      if (!p.stream) {
        std::vector<ChoiceResult> choices(streams->size());
        for (size_t i = 0; i < streams->size(); ++i) {
          RequestStream& st = *(*streams)[i];
          while (!st.wait(choices[i].events, std::chrono::milliseconds(1000))) {
          }
          if (!st.error.empty()) return send_error(res, {503, st.error, "", ""});
          choices[i].done = &st;
        }
        return res.set_content(dump(full_response(head, *model_.tokenizer, choices)), "application/json");
      }
      // Streaming: the provider runs on this connection's thread until every choice ended or the client is gone;
      // each call forwards what the choices have (one chunk per token, tagged with its choice's index), waiting a
      // little on an unfinished one when none had anything.
      struct ChoiceState {
        bool first = true, finished = false, echoed = false;
        size_t sent = 0;  // text bytes sent (completions' logprob offsets)
        std::vector<TokenEvent> prompt;  // echo: the prompt events, sent in the choice's first chunk
      };
      auto state = std::make_shared<std::vector<ChoiceState>>(streams->size());
      auto done = std::make_shared<bool>(false);
      const bool usage = p.include_usage;
      guard.streams = nullptr;  // from here the provider's release callback cancels
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, head, streams, state, done, usage](size_t, httplib::DataSink& sink) {
            auto send = [&](const json& j) {
              const std::string line = "data: " + dump(j) + "\n\n";
              return sink.write(line.data(), line.size());
            };
            bool any = false, all_finished = true;
            for (size_t c = 0; c < streams->size(); ++c) {
              ChoiceState& cs = (*state)[c];
              if (cs.finished) continue;
              RequestStream& st = *(*streams)[c];
              std::vector<TokenEvent> events;
              // One choice waits here up to 200 ms for its next event; several are polled, and when none had
              // anything the call waits on the first unfinished one below (a reader of one stream is woken by it).
              const bool finished = st.wait(events, std::chrono::milliseconds(any || streams->size() > 1 ? 0 : 200));
              any |= !events.empty() || finished;
              if (finished && !st.error.empty()) {
                for (const auto& other : *streams) other->cancel();
                send(error_json({503, st.error, "", ""}));
                const std::string end = "data: [DONE]\n\n";
                sink.write(end.data(), end.size());
                *done = true;
                sink.done();
                return true;
              }
              // Echo: the prompt (and its events) first, once the first generated token or the end has come.
              size_t from = 0;
              while (from < events.size() && events[from].prompt) cs.prompt.push_back(std::move(events[from++]));
              if (head.echo && !cs.echoed && (from < events.size() || finished)) {
                if (!send(echo_chunk(head, *model_.tokenizer, cs.prompt, int(c)))) return false;
                cs.echoed = true;
                cs.sent = head.echo_of(c)->text.size();
              }
              events.erase(events.begin(), events.begin() + std::ptrdiff_t(from));
              // One chunk per token keeps per-token logprobs with their token; plain text chunks skip empty ones.
              for (size_t i = 0; i < events.size(); ++i) {
                const bool last = finished && i + 1 == events.size();
                if (events[i].text.empty() && !head.logprobs && !last && !cs.first) continue;
                if (!send(stream_chunk(head, *model_.tokenizer, {events[i]}, last ? &st : nullptr, cs.first, cs.sent,
                                       int(c)))) {
                  return false;
                }
                cs.first = false;
                cs.sent += events[i].text.size();
              }
              if (finished && events.empty() &&
                  !send(stream_chunk(head, *model_.tokenizer, {}, &st, cs.first, cs.sent, int(c)))) {
                return false;
              }
              cs.finished = finished;
              all_finished &= finished;
            }
            if (!all_finished) {
              if (!any && streams->size() > 1) {  // nothing came: wait on the first unfinished choice for a while
                for (size_t c = 0; c < streams->size(); ++c) {
                  if ((*state)[c].finished) continue;
                  (*streams)[c]->wait_for_event(std::chrono::milliseconds(50));
                  break;
                }
              }
              return true;
            }
            if (usage) {
              json u = stream_chunk(head, *model_.tokenizer, {}, nullptr, false);
              u["choices"] = json::array();
              std::vector<const RequestStream*> ended;
              for (const auto& st : *streams) ended.push_back(st.get());
              u["usage"] = usage_json(ended, head.n);
              if (!send(u)) return false;
            }
            const std::string end = "data: [DONE]\n\n";
            if (!sink.write(end.data(), end.size())) return false;
            *done = true;
            sink.done();
            return true;
          },
          [streams, done](bool) {
            if (*done) return;
            for (const auto& st : *streams) st->cancel();  // the client went away (or writing failed) before the end
          });
    };
  };
  svr_->Post("/v1/chat/completions", completion(Endpoint::chat));
  svr_->Post("/v1/completions", completion(Endpoint::completions));
}

}  // namespace flashlite::engine::server
