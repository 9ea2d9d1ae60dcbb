// `flashlite serve`: an OpenAI-compatible HTTP server over the engine (engine/server/, docs/serving.md).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli_checks.h"
#include "commands.h"
#include "flashlite/errors.h"
#if FLASHLITE_HAVE_SERVER
#include "engine/chat_template.h"
#include "engine/errors.h"
#include "engine/model.h"
#include "engine/server/http_server.h"
#include "engine/server/scheduler.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "model_paths.h"
#endif

namespace flashlite::cli {

#if FLASHLITE_HAVE_SERVER
namespace eng = flashlite::engine;
namespace srv = flashlite::engine::server;

namespace {

struct ServeSettings {
  std::string model, tokenizer, model_name, device = "cpu", precision = "auto", host = "127.0.0.1", api_key;
  int port = 8080, max_batch = 16, kv_pages = 0, page_size = 16, max_queue = 256, context = 0, threads = 0, tp = 1;
  double kv_memory_gib = 0;
  int prefill_chunk = 512, max_body_kib = 1024;
};

// "../models/stories260K" and ".../stories260K.bin" -> "stories260K".
std::string default_model_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing slash
  return p.stem().string().empty() ? "model" : p.stem().string();
}

// Blocks SIGINT / SIGTERM (and SIGUSR1, the wake-up) in every thread started after it; one thread takes them.
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that vanished is a failed write, not the end of the server
  return set;
}

void run_serve(const ServeSettings& s) {
  const sigset_t signals = shutdown_signals();
  const std::string checkpoint = resolve_checkpoint(s.model);
  const std::string tok_path = s.tokenizer.empty() ? tokenizer_beside(checkpoint) : s.tokenizer;
  std::fprintf(stderr, "loading %s (tokenizer %s) ...\n", checkpoint.c_str(), tok_path.c_str());
  const Checkpoint model_files = load_model_checkpoint(checkpoint, s.tp);
  const std::unique_ptr<eng::Tokenizer> tok = eng::load_tokenizer(tok_path);
  const eng::ModelConfig& c = model_files.config;
  if (tok->vocab_size() > c.vocab_size) {
    throw Error(ErrorKind::invalid_value, "tokenizer '" + tok_path + "' has " + std::to_string(tok->vocab_size()) +
                                              " tokens but the model's vocabulary is " + std::to_string(c.vocab_size));
  }
  if (s.context > c.max_seq_len) {
    throw Error(ErrorKind::invalid_value, "--context " + std::to_string(s.context) + " exceeds the model's maximum of " +
                                              std::to_string(c.max_seq_len) + " positions");
  }
  eng::RuntimeOptions ro;
  ro.slots = s.max_batch;
  ro.context = s.context > 0 ? s.context : std::min(c.max_seq_len, 4096);
  ro.threads = s.threads;
  ro.precision = s.precision;
  ro.tp = s.tp;
  // The paged cache (pages taken as sequences grow, freed when they finish) wherever the engine has one: the CPU, and
  // CUDA in bf16 on one GPU. CUDA in fp32 and tensor parallelism keep one region per slot (--max-batch x --context).
  const bool cuda = s.device != "cpu";
  const bool paged = !cuda || (s.tp == 1 && s.precision != "fp32");
  if (paged) {
    ro.kv_page_size = s.page_size;
    const int64_t page_bytes = checked_product({2, c.n_layers, s.page_size, c.kv_dim(), cuda ? 2 : 4});
    ro.kv_pages = s.kv_pages > 0 ? s.kv_pages : s.kv_memory_gib > 0 ? int(std::min<double>(1 << 30, s.kv_memory_gib * (1ull << 30) / page_bytes)) : 0;
    const int64_t pages = ro.kv_pages > 0 ? ro.kv_pages : int64_t(ro.slots) * ((ro.context + s.page_size - 1) / s.page_size);
    if (ro.kv_pages == 0 && s.kv_memory_gib > 0) {
      std::string m = "--kv-memory holds no KV page of ";
      m += std::to_string(page_bytes);
      m += " bytes";
      throw Error(ErrorKind::invalid_value, m);
    }
    // Host memory is checked here; the device's by the engine as it allocates (the cache first, then the weights,
    // whose error then says how much the cache holds).
    if (!cuda) {
      require_memory(checked_product({pages, page_bytes}), "the KV cache of " + std::to_string(pages) + " pages",
                     "lower --kv-pages, --kv-memory, --max-batch or --context");
    }
  } else if (s.kv_pages > 0 || s.kv_memory_gib > 0) {
    throw Error(ErrorKind::invalid_value, std::string("--kv-pages / --kv-memory size the paged KV cache, which CUDA has in "
                                                      "bf16 on one GPU; ") + (s.tp > 1 ? "with --tp" : "in fp32") +
                                              " the engine holds --max-batch x --context positions");
  }
  std::unique_ptr<eng::LlamaModel> model;
  try {
    model = make_model(model_files, ro, s.device);
  } catch (const eng::PagedCacheUnsupported& e) {  // e.g. a head_dim the decode kernels lack: one region per slot
    if (s.kv_pages > 0 || s.kv_memory_gib > 0) throw;
    std::fprintf(stderr, "%s; the KV cache holds --max-batch x --context positions instead\n", e.what());
    ro.kv_page_size = 0;
    ro.kv_pages = 0;
    model = make_model(model_files, ro, s.device);
  }

  const int bos = c.bos_id >= 0 ? c.bos_id : tok->bos_id();
  std::vector<int> stops = c.eos_ids;
  for (const char* name : {"<|eot_id|>", "<|end_of_text|>"}) {
    if (auto id = tok->token_id(name); id && std::find(stops.begin(), stops.end(), *id) == stops.end()) stops.push_back(*id);
  }
  const eng::ChatFormatter chat(*tok, bos, "");
  srv::SchedulerOptions so;
  so.max_queue = s.max_queue;
  so.prefill_chunk = s.prefill_chunk;
  so.max_step_tokens = std::max(s.prefill_chunk, 2048);
  srv::Scheduler sched(*model, {tok.get(), bos, stops}, so);

  srv::ServedModel served{s.model_name.empty() ? default_model_name(s.model) : s.model_name, tok.get(), &chat, bos,
                          model->context(), c.vocab_size, 4};
  srv::HttpOptions ho;
  ho.host = s.host;
  ho.port = s.port;
  ho.api_key = s.api_key;
  ho.max_body_bytes = size_t(s.max_body_kib) * 1024;
  // Every running or queued request holds a connection (queued: up to --max-queue plus the free slots), and one more
  // must still be told 503.
  ho.threads = std::min(4096, 2 * s.max_batch + s.max_queue + 16);
  srv::HttpServer http(sched, served, ho);
  const int port = http.bind();
  const eng::KvUsage kv = model->kv_usage();
  std::fprintf(stderr, "serving '%s' on %s (%s, %d thread(s)): batch %d, context %d, KV %d pages x %d tokens, chat: %s\n",
               served.name.c_str(), model->device().c_str(), c.summary().c_str(), model->threads(), s.max_batch,
               model->context(), kv.pages_total, kv.page_size, chat.description().c_str());
  std::fprintf(stderr, "listening on http://%s:%d\n", s.host.c_str(), port);
  std::fflush(stderr);

  std::atomic<bool> served_out{false};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!served_out) std::fprintf(stderr, "signal %d: shutting down\n", sig);
    http.stop();
  });
  http.serve();
  served_out = true;
  pthread_kill(watcher.native_handle(), SIGUSR1);  // wakes the watcher if no signal came
  watcher.join();
  sched.stop();  // requests still in flight end with "the server is shutting down"
  std::fprintf(stderr, "stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto s = std::make_shared<ServeSettings>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching (docs/serving.md)");
  cmd->add_option("-m,--model", s->model, "Hugging Face checkpoint directory, llama2.c .bin file, or a folder holding one")
      ->required();
  cmd->add_option("--tokenizer", s->tokenizer, "Tokenizer (default: found beside the model)");
  cmd->add_option("--model-name", s->model_name, "The name requests use in 'model' (default: the model's file or folder name)");
  cmd->add_option("--device", s->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--tp", s->tp, "Tensor parallelism: split the model over this many GPUs (cuda) or CPU thread groups")
      ->check(int_between(1, 64))->capture_default_str();
  cmd->add_option("--precision", s->precision, "CUDA: auto (bf16), bf16 or fp32")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}))->capture_default_str();
  cmd->add_option("--host", s->host, "Address to bind (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", s->port, "Port (0: any free one, printed)")->check(int_between(0, 65535))->capture_default_str();
  cmd->add_option("--max-batch", s->max_batch, "Sequences decoded together (KV slots)")->check(int_between(1, 4096))->capture_default_str();
  auto* pages = cmd->add_option("--kv-pages", s->kv_pages, "KV cache pages shared by the sequences (default: enough "
                                                           "for --max-batch full contexts; CUDA: bf16, --tp 1)")->check(int_at_least(1));
  cmd->add_option("--kv-memory", s->kv_memory_gib, "KV cache size in GiB instead of --kv-pages")
      ->check(real_between(1e-6, 1024))->excludes(pages);
  cmd->add_option("--page-size", s->page_size, "Tokens per KV page")->check(int_between(16, 256))->capture_default_str();
  cmd->add_option("--max-queue", s->max_queue, "Requests that may wait for room; past it: 503 with Retry-After")
      ->check(int_between(0, 100000))->capture_default_str();
  cmd->add_option("--context", s->context, "Positions per sequence (default: the model's maximum, at most 4096)")
      ->check(int_between(0, 1 << 24));
  cmd->add_option("--prefill-chunk", s->prefill_chunk, "Prompt tokens a sequence prefills per step (longer prompts in chunks)")
      ->check(int_between(1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-body", s->max_body_kib, "Largest request body in KiB (413 past it)")->check(int_between(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--api-key", s->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("-t,--threads", s->threads, "CPU threads (0 = automatic)")->check(int_between(0, 4096));
  cmd->callback([s] { run_serve(*s); });
}

#else
void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (not in this build)");
  cmd->allow_extras();
  cmd->callback([] {
    throw Error(ErrorKind::invalid_value, "this flashlite was built without the server: install cpp-httplib "
                                          "(libcpp-httplib-dev) and rebuild with -DFLASHLITE_SERVER=ON");
  });
}
#endif

}  // namespace flashlite::cli
