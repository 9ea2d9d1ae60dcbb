#pragma once
// Continuous (iteration-level) batching over one LlamaModel: every step runs one forward call over the sequences in
// flight (a prompt chunk for those still prefilling, one token for the others) and samples. A request joins at the next
// step once a slot and the KV pages it may need are free, leaves the step it finishes, and a cancelled one (client
// gone) leaves at the next step; leaving gives its pages back. One thread (the scheduler's) touches the model; a second
// (the emitter) turns the sampled tokens into text for the requests' streams; HTTP threads only submit, read their
// stream, cancel and read metrics. docs/serving.md tells the whole story.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/server/metrics.h"
#include "engine/server/text_stream.h"
#include "engine/tokenizer.h"

namespace flashlite::engine::server {

// What the scheduler runs for one request (validated by the HTTP layer).
struct GenerationRequest {
  std::vector<int> prompt;  // token ids, BOS and chat template included
  int max_tokens = 16;      // prompt + max_tokens fits the context; 0 (with prompt_logprobs): the prompt scored alone
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (non-empty)
  int top_logprobs = -1;          // -1: no logprobs; else the chosen token's log-probability and this many alternatives
  int prompt_logprobs = -1;       // -1: none; else each prompt token's after the first, with this many alternatives
  bool ignore_eos = false;        // generate max_tokens whatever comes (benchmarks; vLLM's extension)
};

struct TokenLogprob {
  int id = 0;
  float logprob = 0;
};

// One generated token and the text it releases (possibly empty: held back, see TextStream), or (prompt) the
// log-probability of a prompt token after the first, in prompt order and before any generated token.
struct TokenEvent {
  int token = 0;
  std::string text;
  float logprob = 0;               // with logprobs: log-softmax of the model's logits (before temperature)
  std::vector<TokenLogprob> top;   // with top_logprobs > 0: the most likely tokens, most likely first
  bool prompt = false;             // a prompt token's (GenerationRequest::prompt_logprobs): no text, not counted
};

// A request's results as they come; written by the scheduler's emitter thread, read by the request's HTTP thread.
class RequestStream {
 public:
  // Moves the events that came into `out`, waiting up to `timeout` for one; true once the request ended and every
  // event was taken (then finish_reason or error is set).
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for an event or the end, taking nothing (a reader of several streams polls with wait(0)).
  void wait_for_event(std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }  // the client is gone: the scheduler drops it at the next step
  bool cancelled() const { return cancelled_; }
  void push(TokenEvent e);  // (the emitter) queues the event; its reader wakes on notify(), once per batch, not here
  void notify() { cv_.notify_all(); }

  // Valid once wait() returned true.
  std::string finish_reason;  // "stop" (stop token or string) or "length" (max_tokens or a full context)
  std::string error;          // non-empty: it failed (a model error, or the server shutting down)
  int prompt_tokens = 0, completion_tokens = 0;

 private:
  friend class Scheduler;
  void end(const std::string& reason, const std::string& error_message);  // queues the end and wakes the reader
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
};

// The queue is full: the HTTP layer answers 503 with Retry-After.
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SchedulerOptions {
  int max_queue = 256;        // requests waiting for a slot or pages (beyond those a free slot takes at the next step);
                              // past it submit() throws QueueFull
  int prefill_chunk = 512;    // prompt tokens a sequence prefills per step (chunked prefill of longer prompts)
  int max_step_tokens = 2048; // prefill tokens per step over all sequences (at least one chunk always runs)
};

struct ModelText {  // what the scheduler needs of the tokenizer and the model's special ids
  const Tokenizer* tokenizer = nullptr;
  int bos = -1;
  std::vector<int> stop_ids;  // generation ends on these (not emitted)
};

class Scheduler {
 public:
  Scheduler(LlamaModel& model, ModelText text, const SchedulerOptions& options);
  ~Scheduler();  // stop()

  // Queues a request; throws QueueFull past max_queue, Error when it can never fit the cache or the server stopped.
  std::shared_ptr<RequestStream> submit(GenerationRequest request);
  // Ends every request (error "the server is shutting down") and the scheduler thread. Idempotent.
  void stop();

  int context() const { return context_; }
  int pages_total() const { return pages_total_; }
  int pages_needed(const GenerationRequest& r) const;  // the KV pages the request may take at most
  std::string metrics_text();  // Prometheus text

 private:
  struct Sequence;
  struct Output;  // what the emitter keeps of a request: its stream, its TextStream, its counts
  struct Emit;    // one item for the emitter: a sampled token, the request's end, or both
  void loop();
  void admit();                          // waiting -> running while a slot and pages are free (mu_ held)
  void step();                           // one forward call over the running sequences
  void sample(Sequence& s, const LogitsOutput& out, int row);
  void score_prompt(Sequence& s, const LogitsOutput& out, int row0, int rows, size_t fed);  // prompt_logprobs
  // Gives the slot and pages back and counts the outcome; end() also queues the request's end for the emitter.
  void release(Sequence& s, const std::string& reason, bool failed);
  void end(Sequence& s, const char* reason, const std::string& error);
  void hand_over();                   // emits_ to the emitter (one lock per step)
  void refresh_usage(double busy_s);  // also adds a step's busy time (one lock)
  // Before the first request: one forward per row count the model names (LlamaModel::warm_up_rows: on CUDA one per
  // GEMM row bucket a step can reach) and one over every slot, then forgotten, so that no request pays the algorithm
  // searches and first kernel loads of a new shape (its first token milliseconds later). Nothing on the CPU.
  void warm_up();
  // The emitter thread: text, stream pushes, wakes, ends and per-token metrics, in the order the scheduler sampled.
  void emit_loop();
  void emit(std::vector<Emit>& batch);

  LlamaModel& model_;
  ModelText text_;
  SchedulerOptions opt_;
  int context_ = 0, vocab_ = 0, page_size_ = 0, pages_total_ = 0;

  std::mutex mu_;  // waiting_, stopping_, the scheduler's metrics
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only, ordered by slot
  std::set<int> free_slots_;                        // mu_ (changed by the scheduler thread only)
  int free_slot_count_ = 0;                         // mu_: free_slots_.size() for submit()
  int reserved_pages_ = 0;                          // pages the running sequences may take at most
  std::thread thread_;

  // The emitter: the scheduler thread fills emits_ during a step and hands it over whole; the emitter swaps it out.
  std::vector<Emit> emits_;  // scheduler thread
  std::mutex emit_mu_;       // emit_pending_, emit_stopping_
  std::condition_variable emit_cv_;
  std::vector<Emit> emit_pending_;
  bool emit_stopping_ = false;
  std::thread emitter_;

  // Metrics (mu_): the scheduler's.
  int running_count_ = 0, pages_used_ = 0;
  uint64_t requests_finished_ = 0, requests_failed_ = 0, requests_cancelled_ = 0, requests_rejected_ = 0;
  uint64_t steps_total_ = 0;
  double step_seconds_ = 0, forward_seconds_ = 0;  // the scheduler's busy time per step; of it, the forward calls'
  Histogram batch_size_, step_tokens_;
  // Metrics (stats_mu_): the emitter's, stamped when a token is handed to its stream (what its client can see).
  std::mutex stats_mu_;
  uint64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;
  Histogram ttft_s_, itl_s_, e2e_s_;
};

}  // namespace flashlite::engine::server
