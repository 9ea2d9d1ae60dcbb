#include "engine/server/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "engine/errors.h"

namespace flashlite::engine::server {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<double> latency_buckets() {  // seconds
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
}  // namespace

// ---- RequestStream

bool RequestStream::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return done_;
}

void RequestStream::wait_for_event(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !events_.empty(); });
}

void RequestStream::push(TokenEvent e) {
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::move(e));
}

void RequestStream::end(const std::string& reason, const std::string& error_message) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;
    finish_reason = reason;
    error = error_message;
    done_ = true;
  }
  cv_.notify_all();
}

// ---- Scheduler

// What the emitter keeps of a request. Shared: a request can leave the batch while its last tokens still wait for the
// emitter, and the emitter can end a request (a stop string) while it is still in the batch.
struct Scheduler::Output {
  Output(const GenerationRequest& r, const ModelText& t)
      : stream(std::make_shared<RequestStream>()),
        text(*t.tokenizer, t.bos, r.prompt.empty() ? -1 : r.prompt.back(), r.stop),
        prompt_tokens(int(r.prompt.size())) {}
  std::shared_ptr<RequestStream> stream;
  TextStream text;        // emitter thread only
  int prompt_tokens = 0;
  int emitted = 0;        // emitter: the tokens its client got (usage.completion_tokens)
  bool ended = false;     // emitter: the stream ended; whatever comes after is dropped
  Clock::time_point arrived = Clock::now(), last_token;  // last_token: emitter
  // Set by the emitter when it ended the request itself (a stop string in the text, or its own failure) while the
  // scheduler may still run it: the scheduler frees it at its next loop top, as it does a cancelled one.
  enum Early { none = 0, stopped = 1, failed = 2 };
  std::atomic<int> early{none};
};

// One item for the emitter: a sampled token (token >= 0), the request's end (reason set), or both. A step's items go
// over in one batch, in order, so that a request's end always follows its last token.
struct Scheduler::Emit {
  std::shared_ptr<Output> out;
  int token = -1;
  bool stop_token = false;  // the token is a stop token: it adds no text, and reason is "stop"
  float logprob = 0;
  std::vector<TokenLogprob> top;
  const char* reason = nullptr;  // ends the request: "stop", "length", "cancelled", or "" with error
  std::string error;
  std::vector<TokenEvent> prompt;  // prompt tokens' log-probabilities (prompt_logprobs), before any token
  static Emit ending(std::shared_ptr<Output> out, const char* reason, std::string error = {}) {
    Emit e;
    e.out = std::move(out);
    e.reason = reason;
    e.error = std::move(error);
    return e;
  }
};

struct Scheduler::Sequence {
  Sequence(GenerationRequest r, const ModelText& t)
      : req(std::move(r)),
        out(std::make_shared<Output>(req, t)),
        sampler(req.sampling, 0) {}  // stream 0: the same draws as `flashlite generate --seed` for one prompt
  RequestStream& stream() const { return *out->stream; }
  GenerationRequest req;
  std::shared_ptr<Output> out;
  Sampler sampler;
  int slot = -1, pages = 0;
  size_t fed = 0;  // prompt tokens in the cache
  int last = -1;   // the last sampled token (the next step's input)
  int generated = 0;
};

Scheduler::Scheduler(LlamaModel& model, ModelText text, const SchedulerOptions& options)
    : model_(model),
      text_(std::move(text)),
      opt_(options),
      batch_size_({1, 2, 4, 8, 16, 32, 64, 128, 256}),
      step_tokens_({1, 4, 16, 64, 256, 1024, 4096}),
      ttft_s_(latency_buckets()),
      itl_s_(latency_buckets()),
      e2e_s_(latency_buckets()) {
  if (opt_.max_queue < 0 || opt_.prefill_chunk < 1 || opt_.max_step_tokens < 1) {
    fail("scheduler options: max_queue " + std::to_string(opt_.max_queue) + ", prefill_chunk " +
         std::to_string(opt_.prefill_chunk) + ", max_step_tokens " + std::to_string(opt_.max_step_tokens) +
         "; expected >= 0, >= 1, >= 1");
  }
  context_ = model_.context();
  vocab_ = model_.config().vocab_size;
  for (int s = 0; s < model_.slots(); ++s) {
    model_.reset(s);
    free_slots_.insert(s);
  }
  free_slot_count_ = int(free_slots_.size());
  const KvUsage u = model_.kv_usage();
  page_size_ = u.page_size;
  pages_total_ = u.pages_total;
  warm_up();
  emitter_ = std::thread([this] { emit_loop(); });
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (...) {
    stop();  // the emitter returns and is joined (a joinable thread must not be destroyed)
    throw;
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::warm_up() {
  // A step's rows: its prompt chunks and one per decoding sequence; one sequence holds at most `longest`.
  const int longest = std::min(context_, pages_total_ * page_size_);
  const std::vector<int> rows = model_.warm_up_rows(std::min(opt_.max_step_tokens + model_.slots(), longest));
  if (rows.empty()) return;
  const int token = text_.bos >= 0 ? text_.bos : 0;
  LogitsRequest argmax;
  argmax.kind = LogitsRequest::Kind::argmax;
  // Only a speed-up: a shape the cache cannot hold (too few pages or context) is left to its first request.
  auto warm = [&](const std::vector<SequenceInput>& step) {
    try {
      model_.forward_select(step, argmax);
    } catch (const std::exception&) {
    }
    for (const SequenceInput& in : step) model_.reset(in.slot);
  };
  for (int n : rows) {  // as decode steps of n slots where there are as many (the CUDA engine pads mixed steps)
    std::vector<SequenceInput> step;
    if (n <= model_.slots()) {
      for (int slot = 0; slot < n; ++slot) step.push_back({slot, {token}, false});
    } else {
      step.push_back({0, std::vector<int>(size_t(n), token), false});
    }
    warm(step);
  }
  std::vector<SequenceInput> every;  // one token on every slot: the widest logits rows
  for (int slot = 0; slot < model_.slots(); ++slot) every.push_back({slot, {token}, false});
  warm(every);
  for (int slot = 0; slot < model_.slots(); ++slot) model_.reset(slot);
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Then the emitter: it drains what the scheduler handed over last (the ends of every request left), then returns.
  {
    std::lock_guard<std::mutex> lk(emit_mu_);
    emit_stopping_ = true;
  }
  emit_cv_.notify_one();
  if (emitter_.joinable()) emitter_.join();
}

int Scheduler::pages_needed(const GenerationRequest& r) const {
  const int64_t tokens = int64_t(r.prompt.size()) + r.max_tokens;
  return int((tokens + page_size_ - 1) / page_size_);
}

std::shared_ptr<RequestStream> Scheduler::submit(GenerationRequest request) {
  if (request.prompt.empty()) fail("the prompt has no tokens");
  if (int64_t(request.prompt.size()) + request.max_tokens > context_) {
    fail("prompt (" + std::to_string(request.prompt.size()) + " tokens) + max_tokens (" + std::to_string(request.max_tokens) +
         ") exceed the context of " + std::to_string(context_));
  }
  if (pages_needed(request) > pages_total_) {
    fail("the request may need " + std::to_string(pages_needed(request)) + " KV pages; the cache has " +
         std::to_string(pages_total_));
  }
  auto seq = std::make_unique<Sequence>(std::move(request), text_);
  std::shared_ptr<RequestStream> stream = seq->out->stream;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) fail("the server is shutting down");
    // Requests a free slot will take at the next step are not waiting for room: the limit counts the others.
    if (int(waiting_.size()) >= opt_.max_queue + free_slot_count_) {
      ++requests_rejected_;
      throw QueueFull(std::to_string(waiting_.size()) + " requests are waiting (--max-queue " +
                      std::to_string(opt_.max_queue) + "); retry later");
    }
    waiting_.push_back(std::move(seq));
  }
  cv_.notify_all();
  return stream;
}

void Scheduler::admit() {
  // Cancelled while waiting: gone before taking anything.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->stream().cancelled()) {
      emits_.push_back(Emit::ending((*it)->out, "cancelled"));
      ++requests_cancelled_;
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  // First come, first served: the head waits for room rather than being overtaken (no starvation).
  while (!waiting_.empty() && !free_slots_.empty()) {
    Sequence& s = *waiting_.front();
    const int need = pages_needed(s.req);
    if (reserved_pages_ + need > pages_total_) break;
    s.slot = *free_slots_.begin();
    free_slots_.erase(free_slots_.begin());
    free_slot_count_ = int(free_slots_.size());
    s.pages = need;
    reserved_pages_ += need;
    s.stream().prompt_tokens = int(s.req.prompt.size());
    auto at = std::lower_bound(running_.begin(), running_.end(), s.slot,
                               [](const std::unique_ptr<Sequence>& a, int slot) { return a->slot < slot; });
    running_.insert(at, std::move(waiting_.front()));
    waiting_.pop_front();
  }
  running_count_ = int(running_.size());
}

void Scheduler::release(Sequence& s, const std::string& reason, bool failed) {
  model_.reset(s.slot);  // gives the slot's pages back
  reserved_pages_ -= s.pages;
  const int early = s.out->early.load();  // the emitter ended it first: that is the outcome its client saw
  std::lock_guard<std::mutex> lk(mu_);
  free_slots_.insert(s.slot);
  free_slot_count_ = int(free_slots_.size());
  s.slot = -1;  // gone from the batch (step() drops it)
  if (early == Output::failed || (early == Output::none && failed)) ++requests_failed_;
  else if (early == Output::none && reason == "cancelled") ++requests_cancelled_;
  else ++requests_finished_;
}

void Scheduler::end(Sequence& s, const char* reason, const std::string& error) {
  release(s, reason, !error.empty());
  emits_.push_back(Emit::ending(s.out, reason, error));
}

void Scheduler::hand_over() {
  if (emits_.empty()) return;
  {
    std::lock_guard<std::mutex> lk(emit_mu_);
    if (emit_pending_.empty()) {
      emit_pending_.swap(emits_);  // the usual case: the emitter took the last batch; buffers go back and forth
    } else {
      emit_pending_.insert(emit_pending_.end(), std::make_move_iterator(emits_.begin()),
                           std::make_move_iterator(emits_.end()));
      emits_.clear();
    }
  }
  emit_cv_.notify_one();
}

void Scheduler::refresh_usage(double busy_s) {
  const KvUsage u = model_.kv_usage();
  std::lock_guard<std::mutex> lk(mu_);
  step_seconds_ += busy_s;
  pages_used_ = u.pages_used;
  running_count_ = int(running_.size());
}

void Scheduler::loop() {
  // OpenMP's thread count is per thread: this one runs the model, so it takes the model's (as `generate`'s main does).
  omp_set_num_threads(std::max(1, model_.threads()));
  Clock::time_point busy;
  while (true) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
      busy = Clock::now();  // from admission to the step's last token handed over
      admit();
    }
    // Cancelled sequences leave before the step runs, and so do those the emitter ended on a stop string (their
    // stream has ended already: the tokens sampled for them since are dropped).
    for (auto it = running_.begin(); it != running_.end();) {
      Sequence& s = **it;
      if (s.out->early.load() != Output::none) {
        release(s, "stop", false);
        it = running_.erase(it);
      } else if (s.stream().cancelled()) {
        end(s, "cancelled", "");
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    const bool stepped = !running_.empty();
    if (stepped) step();
    hand_over();
    refresh_usage(stepped ? seconds(Clock::now() - busy) : 0.0);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& s : waiting_) emits_.push_back(Emit::ending(s->out, "", "the server is shutting down"));
    waiting_.clear();
    for (auto& s : running_) {
      model_.reset(s->slot);
      emits_.push_back(Emit::ending(s->out, "", "the server is shutting down"));
    }
    running_.clear();
  }
  hand_over();  // stop() then drains the emitter
}

void Scheduler::step() {
  std::vector<SequenceInput> inputs;
  std::vector<Sequence*> who;       // per input
  std::vector<bool> samples;        // per input: its logits row picks a token (last prompt chunk, or decoding)
  bool full_logits = false;
  int prefill_budget = opt_.max_step_tokens, prefill_rows = 0;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.fed < s.req.prompt.size()) {
      // A sequence's chunks depend on its prompt only, so its numbers never depend on the batch it shares.
      const int n = int(std::min<size_t>(opt_.prefill_chunk, s.req.prompt.size() - s.fed));
      if (prefill_rows > 0 && n > prefill_budget) continue;  // next step
      prefill_budget -= n;
      prefill_rows += n;
      const bool score = s.req.prompt_logprobs >= 0;  // a row per prompt token: their log-probabilities
      const auto first = s.req.prompt.begin() + std::ptrdiff_t(s.fed);
      inputs.push_back({s.slot, std::vector<int>(first, first + n), score});
      full_logits |= score;
      s.fed += size_t(n);
      samples.push_back(s.fed == s.req.prompt.size());
    } else {
      inputs.push_back({s.slot, {s.last}, false});
      samples.push_back(true);
    }
    who.push_back(&s);
    if (samples.back() && (s.req.sampling.temperature > 0 || s.req.top_logprobs >= 0 || s.req.sampling.penalizes())) {
      full_logits = true;  // (the penalties change the row before any choice)
    }
  }
  LogitsRequest request;
  request.kind = full_logits ? LogitsRequest::Kind::logits : LogitsRequest::Kind::argmax;
  int tokens = 0;
  for (const SequenceInput& in : inputs) tokens += int(in.tokens.size());
  auto count_step = [&](double forward) {  // before any request of the step ends, so its client sees it counted
    std::lock_guard<std::mutex> lk(mu_);
    forward_seconds_ += forward;
    ++steps_total_;
    batch_size_.observe(double(inputs.size()));
    step_tokens_.observe(double(tokens));
  };
  try {
    const auto t0 = Clock::now();
    const LogitsOutput out = model_.forward_select(inputs, request);
    count_step(seconds(Clock::now() - t0));
    int row = 0;  // the input's first logits row (one per token with all_logits, else one)
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int rows = inputs[i].all_logits ? int(inputs[i].tokens.size()) : 1;
      if (inputs[i].all_logits) score_prompt(*who[i], out, row, rows, who[i]->fed - size_t(rows));  // (a prefill)
      if (samples[i] && who[i]->req.max_tokens == 0) {
        end(*who[i], "length", "");  // the prompt scored, nothing to generate
      } else if (samples[i]) {
        sample(*who[i], out, row + rows - 1);
      }
      row += rows;
    }
  } catch (const std::exception& e) {
    // The model rejected the step (its cache is as before it): every sequence in it fails, the others go on.
    for (Sequence* s : who) {
      if (s->slot >= 0) end(*s, "", std::string("generation failed: ") + e.what());
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Sequence>& s) { return s->slot < 0; }),
                 running_.end());
}

// Log-softmax of a logits row: lse, and the k most likely tokens with their log-probabilities.
namespace {
double log_sum_exp(const float* logits, int vocab) {
  float mx = -INFINITY;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += std::exp(double(logits[i]) - mx);
  return mx + std::log(z);
}
std::vector<TokenLogprob> top_of(const float* logits, int vocab, int k, double lse) {
  if (k <= 0) return {};  // (logprobs 0: the chosen token's alone, no pass over the vocabulary)
  std::vector<std::pair<float, int>> cand;
  cand.reserve(size_t(vocab));
  for (int i = 0; i < vocab; ++i) cand.push_back({logits[i], i});
  const size_t n = std::min<size_t>(size_t(std::max(k, 0)), cand.size());
  std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), Sampler::before);
  std::vector<TokenLogprob> top;
  for (size_t i = 0; i < n; ++i) top.push_back({cand[i].second, float(cand[i].first - lse)});
  return top;
}
}  // namespace

// The prompt tokens this input's rows predict (row r: the token after prompt position fed + r), as prompt events for
// the emitter, ahead of any sampled token.
void Scheduler::score_prompt(Sequence& s, const LogitsOutput& out, int row0, int rows, size_t fed) {
  Emit ev;
  ev.out = s.out;
  for (int r = 0; r < rows; ++r) {
    const size_t target = fed + size_t(r) + 1;
    if (target >= s.req.prompt.size()) break;  // the last row predicts the first generated token
    const float* logits = out.logits + size_t(row0 + r) * vocab_;
    const double lse = log_sum_exp(logits, vocab_);
    TokenEvent te;
    te.prompt = true;
    te.token = s.req.prompt[target];
    te.logprob = te.token >= 0 && te.token < vocab_ ? float(logits[te.token] - lse) : -INFINITY;
    te.top = top_of(logits, vocab_, s.req.prompt_logprobs, lse);
    ev.prompt.push_back(std::move(te));
  }
  if (!ev.prompt.empty()) emits_.push_back(std::move(ev));
}

// Only what needs this step's logits or decides the next step stays here (the token, log-probabilities, the end on a
// stop token, max_tokens or a full context); the text, the stream and the per-token metrics are the emitter's.
void Scheduler::sample(Sequence& s, const LogitsOutput& out, int row) {
  Emit& ev = emits_.emplace_back();
  ev.out = s.out;
  const float* logits = out.kind == LogitsRequest::Kind::logits ? out.logits + size_t(row) * vocab_ : nullptr;
  ev.token = logits ? s.sampler.sample(logits, vocab_) : out.ids[row];
  if (logits && s.req.top_logprobs >= 0) {
    const double lse = log_sum_exp(logits, vocab_);
    ev.logprob = float(logits[ev.token] - lse);
    ev.top = top_of(logits, vocab_, s.req.top_logprobs, lse);
  }
  s.sampler.accept(ev.token);  // the penalties' window: the sampled tokens (a no-op without penalties)
  ++s.generated;
  s.last = ev.token;
  if (!s.req.ignore_eos && std::find(text_.stop_ids.begin(), text_.stop_ids.end(), ev.token) != text_.stop_ids.end()) {
    ev.stop_token = true;
    ev.reason = "stop";
  } else if (s.generated >= s.req.max_tokens || model_.length(s.slot) + 1 > context_) {
    ev.reason = "length";  // the emitter may still make it "stop" (a stop string in this last token's text)
  }
  if (ev.reason) release(s, ev.reason, false);  // (ev stays valid: release adds no item)
}

// ---- The emitter

void Scheduler::emit_loop() {
  std::vector<Emit> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lk(emit_mu_);
      emit_cv_.wait(lk, [&] { return emit_stopping_ || !emit_pending_.empty(); });
      if (emit_pending_.empty()) return;  // stopping, and the scheduler's last items are out
      batch.swap(emit_pending_);
    }
    try {
      emit(batch);
    } catch (...) {  // the bookkeeping failed (no memory): no client may wait forever, so every stream here ends
      // (also those marked ended whose end() had not run yet; a stream that did end ignores a second end)
      for (Emit& e : batch) {
        Output& o = *e.out;
        o.ended = true;
        if (!e.reason) o.early = Output::failed;  // the scheduler frees it next
        try {
          o.stream->end("", "generation failed: the server could not deliver its tokens");
        } catch (...) {
        }
      }
    }
    batch.clear();  // the last references of finished requests may go here
  }
}

void Scheduler::emit(std::vector<Emit>& batch) {
  // Latencies are stamped here, when the tokens go to their streams (one clock read per batch): what a client sees,
  // the emitter's lag included.
  const auto now = Clock::now();
  std::vector<double> ttft, itl, e2e;
  uint64_t prompt_tokens = 0, tokens = 0;
  std::vector<RequestStream*> woken;  // (their Outputs, held by `batch`, keep them alive)
  std::vector<const Emit*> ended;
  for (Emit& e : batch) {
    Output& o = *e.out;
    if (o.ended) continue;  // ended early (a stop string): what the scheduler sampled since is not the client's
    for (TokenEvent& p : e.prompt) o.stream->push(std::move(p));  // (no text, not counted)
    try {
      if (e.token >= 0) {
        TokenEvent ev{e.token, "", e.logprob, std::move(e.top)};
        if (e.stop_token) {
          ev.text = o.text.flush();  // a stop token adds no text
        } else {
          ev.text = o.text.push(e.token);
          if (o.text.stopped()) {
            if (!e.reason) o.early = Output::stopped;  // still in the batch: the scheduler frees it next
            e.reason = "stop";
          } else if (e.reason) {
            ev.text += o.text.flush();  // the last token: what was held back goes too
          }
        }
        o.stream->push(std::move(ev));  // counted once its client has it
        if (o.emitted == 0) {
          ttft.push_back(seconds(now - o.arrived));
          prompt_tokens += uint64_t(o.prompt_tokens);
        } else {
          itl.push_back(seconds(now - o.last_token));
        }
        o.last_token = now;
        ++o.emitted;
        ++tokens;
      }
    } catch (const std::exception& ex) {  // never lose it: the request fails, and the scheduler frees it next
      if (!e.reason) o.early = Output::failed;
      e.reason = "";
      e.error = std::string("generation failed: ") + ex.what();
    }
    if (e.reason) {
      o.ended = true;
      o.stream->completion_tokens = o.emitted;  // exactly the tokens its client got (none past a stop string)
      if (e.error.empty() && std::string_view(e.reason) != "cancelled") e2e.push_back(seconds(now - o.arrived));
      ended.push_back(&e);
    } else {
      woken.push_back(o.stream.get());
    }
  }
  {  // one lock per batch, before any stream ends, so that a client sees its request counted
    std::lock_guard<std::mutex> lk(stats_mu_);
    for (double v : ttft) ttft_s_.observe(v);
    for (double v : itl) itl_s_.observe(v);
    for (double v : e2e) e2e_s_.observe(v);
    prompt_tokens_total_ += prompt_tokens;
    generation_tokens_total_ += tokens;
  }
  // The wakes (system calls) last: a reader woken early would only compete with this thread for a core.
  for (RequestStream* st : woken) st->notify();
  for (const Emit* e : ended) e->out->stream->end(e->reason, e->error);  // after its last token: then [DONE]
}

std::string Scheduler::metrics_text() {
  std::lock_guard<std::mutex> lk(mu_);
  std::lock_guard<std::mutex> stats(stats_mu_);
  std::string o;
  render_metric(o, "flashlite_requests_running", "gauge", "Requests in the running batch", running_count_);
  render_metric(o, "flashlite_requests_waiting", "gauge", "Requests queued for a slot or KV pages", double(waiting_.size()));
  render_metric(o, "flashlite_requests_finished_total", "counter", "Requests that ended with stop or length",
                double(requests_finished_));
  render_metric(o, "flashlite_requests_cancelled_total", "counter", "Requests dropped because their client went away",
                double(requests_cancelled_));
  render_metric(o, "flashlite_requests_failed_total", "counter", "Requests ended by an error", double(requests_failed_));
  render_metric(o, "flashlite_requests_rejected_total", "counter", "Requests refused with 503 (queue full)",
                double(requests_rejected_));
  render_metric(o, "flashlite_prompt_tokens_total", "counter", "Prompt tokens prefilled", double(prompt_tokens_total_));
  render_metric(o, "flashlite_generation_tokens_total", "counter", "Tokens generated", double(generation_tokens_total_));
  render_metric(o, "flashlite_steps_total", "counter", "Forward steps of the batch", double(steps_total_));
  render_metric(o, "flashlite_step_seconds_total", "counter",
                "Scheduler time of the steps: admission, the forward call, sampling and streaming", step_seconds_);
  render_metric(o, "flashlite_step_forward_seconds_total", "counter",
                "Time inside the model's forward calls (on CUDA: the step on the GPU and the copy back)",
                forward_seconds_);
  render_metric(o, "flashlite_kv_pages_total", "gauge", "KV cache pages", pages_total_);
  render_metric(o, "flashlite_kv_pages_used", "gauge", "KV cache pages holding tokens", pages_used_);
  render_metric(o, "flashlite_kv_pages_free", "gauge", "KV cache pages free", pages_total_ - pages_used_);
  render_metric(o, "flashlite_kv_page_size", "gauge", "Tokens per KV page", page_size_);
  ttft_s_.render(o, "flashlite_time_to_first_token_seconds", "Arrival to first token");
  itl_s_.render(o, "flashlite_inter_token_latency_seconds", "Time between a request's consecutive tokens");
  e2e_s_.render(o, "flashlite_request_latency_seconds", "Arrival to the last token of finished requests");
  batch_size_.render(o, "flashlite_batch_size", "Sequences per forward step");
  step_tokens_.render(o, "flashlite_step_tokens", "Tokens (prompt chunks and decode) per forward step");
  return o;
}

}  // namespace flashlite::engine::server
