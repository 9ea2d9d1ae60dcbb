#pragma once
// Continuous (iteration-level) batching over one LlamaModel: every step runs one forward call over the sequences in
// flight (a prompt chunk for those still prefilling, one token for the others), samples, and hands each request its
// tokens as text. A request joins at the next step once a slot and the KV pages it may need are free, leaves the step
// it finishes, and a cancelled one (client gone) leaves at the next step; leaving gives its pages back. One thread
// (the scheduler's) touches the model; HTTP threads only submit, read their stream, cancel and read metrics.
// docs/serving.md tells the whole story.
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
  int max_tokens = 16;      // prompt + max_tokens fits the context
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (non-empty)
  int top_logprobs = -1;          // -1: no logprobs; else the chosen token's log-probability and this many alternatives
  bool ignore_eos = false;        // generate max_tokens whatever comes (benchmarks; vLLM's extension)
};

struct TokenLogprob {
  int id = 0;
  float logprob = 0;
};

// One generated token and the text it releases (possibly empty: held back, see TextStream).
struct TokenEvent {
  int token = 0;
  std::string text;
  float logprob = 0;               // with logprobs: log-softmax of the model's logits (before temperature)
  std::vector<TokenLogprob> top;   // with top_logprobs > 0: the most likely tokens, most likely first
};

// A request's results as they come; written by the scheduler thread, read by the request's HTTP thread.
class RequestStream {
 public:
  // Moves the events that came into `out`, waiting up to `timeout` for one; true once the request ended and every
  // event was taken (then finish_reason or error is set).
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }  // the client is gone: the scheduler drops it at the next step
  bool cancelled() const { return cancelled_; }
  void push(TokenEvent e);  // (the scheduler) queues the event; its reader wakes on notify() (StreamWaker), not here
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

// Wakes the readers of streams that got tokens, on a thread of its own: a wake is a system call (and often a context
// switch), and one per running request per step, made by the scheduler thread itself, kept the GPU waiting (about
// 30 us per token on a 2-core machine at 64 clients, measured in the scheduler's step).
class StreamWaker {
 public:
  StreamWaker();
  ~StreamWaker();  // wakes what is pending, then joins
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;
  void wake(std::vector<std::shared_ptr<RequestStream>>& streams);  // takes them (leaves `streams` empty)

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> pending_;
  bool stopping_ = false;
  std::thread thread_;
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
  void loop();
  void admit();                          // waiting -> running while a slot and pages are free (mu_ held)
  void step();                           // one forward call over the running sequences
  void sample(Sequence& s, const LogitsOutput& out, int row);
  void release(Sequence& s, const std::string& reason, const std::string& error);  // slot and pages back
  void refresh_usage(double busy_s);  // also adds a step's busy time (one lock)
  // Before the first request: one forward per row count the model names (LlamaModel::warm_up_rows: on CUDA one per
  // GEMM row bucket a step can reach) and one over every slot, then forgotten, so that no request pays the algorithm
  // searches and first kernel loads of a new shape (its first token milliseconds later). Nothing on the CPU.
  void warm_up();

  LlamaModel& model_;
  ModelText text_;
  SchedulerOptions opt_;
  int context_ = 0, vocab_ = 0, page_size_ = 0, pages_total_ = 0;

  std::mutex mu_;  // waiting_, stopping_, the metrics
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only, ordered by slot
  std::set<int> free_slots_;                        // mu_ (changed by the scheduler thread only)
  int free_slot_count_ = 0;                         // mu_: free_slots_.size() for submit()
  int reserved_pages_ = 0;                          // pages the running sequences may take at most
  std::thread thread_;
  StreamWaker waker_;
  std::vector<std::shared_ptr<RequestStream>> woken_;  // scheduler thread: the streams a step pushed tokens to

  // Metrics (mu_).
  int running_count_ = 0, pages_used_ = 0;
  uint64_t requests_finished_ = 0, requests_failed_ = 0, requests_cancelled_ = 0, requests_rejected_ = 0;
  uint64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0, steps_total_ = 0;
  double step_seconds_ = 0, forward_seconds_ = 0;  // the scheduler's busy time per step; of it, the forward calls'
  Histogram ttft_s_, itl_s_, e2e_s_, batch_size_, step_tokens_;
};

}  // namespace flashlite::engine::server
