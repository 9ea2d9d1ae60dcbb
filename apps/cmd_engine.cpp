// `flashlite generate | chat | score | tokenize`: the Llama engine on the command line.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "engine/chat_template.h"
#include "engine/errors.h"
#include "engine/generator.h"
#include "engine/mapped_file.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "model_paths.h"

namespace flashlite::cli {

namespace eng = flashlite::engine;
using json = nlohmann::json;

namespace {

struct ModelSettings {
  std::string model, tokenizer, device = "cpu", attention = "auto", precision = "auto";
  int threads = 0, context = 0, tp = 1;
  bool json_out = false;
  bool no_graphs = false, profile = false, verbose = false, nccl_only = false;  // CUDA: CudaEngineOptions
};

struct SamplingSettings {
  int max_tokens = 256;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  float repeat_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  int repeat_last_n = 64;
};

// Upper limits of the size options, checked before anything is allocated (the memory they imply is checked once the
// model's shape is known).
constexpr int kMaxPositions = 1 << 24;  // --context, --max-tokens, --prompt-tokens
constexpr int kMaxSequences = 1 << 16;  // --batch

void add_model_options(CLI::App* cmd, ModelSettings& m) {
  cmd->add_option("-m,--model", m.model, "Hugging Face checkpoint directory, llama2.c .bin file, or a folder holding one "
                                         "(its tok*.bin tokenizer is found beside it)")->required();
  cmd->add_option("--tokenizer", m.tokenizer, "Tokenizer (llama2.c .bin or tokenizer.json); default: the model directory, "
                                              "or the tok*.bin beside a llama2.c model");
  cmd->add_option("--device", m.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--tp", m.tp, "Tensor parallelism: split the model over this many GPUs (cuda: devices 0..N-1) or "
                                "CPU thread groups (cpu)")
      ->check(int_between(1, 64))->capture_default_str();
  cmd->add_option("-t,--threads", m.threads, "CPU threads (0 = automatic: 1 for tiny models)")->check(int_between(0, 4096));
  cmd->add_option("--context", m.context, "KV cache positions per sequence (default: prompt + max tokens, or 4096 for chat; "
                                          "at most the model's maximum)")
      ->check(int_between(0, kMaxPositions));
  cmd->add_option("--attention", m.attention, "flashlite attention backend: auto (cpu / cuda fused), cpu, naive, reference")
      ->check(CLI::IsMember({"auto", "cpu", "naive", "reference", "cuda"}))->capture_default_str();
  cmd->add_option("--precision", m.precision, "CUDA weights and activations: auto (bf16), bf16 or fp32")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}))->capture_default_str();
  cmd->add_flag("--json", m.json_out, "Print one JSON object instead of streaming text");
  cmd->add_flag("--no-graphs", m.no_graphs, "CUDA: launch each decode step's kernels one by one instead of replaying "
                                            "a CUDA graph (debugging; slower)");
  cmd->add_flag("--nccl-only", m.nccl_only, "CUDA --tp: every all-reduce through NCCL, none through the one-shot "
                                            "kernel over NVLink peer memory (comparison, debugging)");
  cmd->add_flag("--profile", m.profile, "CUDA: print per-kernel-group times of decode steps on stderr every 16 steps "
                                        "(those steps run eagerly, without graphs; under --tp their sums run as kernels "
                                        "of their own, the group all-reduce)");
  cmd->add_flag("--verbose", m.verbose, "CUDA: print how the model runs (device, GEMVs or cuBLASLt, graphs, PDL, "
                                        "attention kernel) on stderr");
}

void add_sampling_options(CLI::App* cmd, SamplingSettings& s) {
  cmd->add_option("-n,--max-tokens", s.max_tokens, "New tokens to generate (per sequence / per turn)")
      ->check(int_between(0, kMaxPositions))->capture_default_str();
  cmd->add_option("--temperature", s.temperature, "0 = greedy")->check(real_between(0, 100))->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0 = off)")->check(int_at_least(0))->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass (1 = off)")->check(real_between(0, 1))->capture_default_str();
  cmd->add_option("-s,--seed", s.seed, "Random seed")->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "Divide the positive logits (multiply the negative ones) of tokens "
                                                        "seen in the last --repeat-last-n tokens by this (1 = off)")
      ->check(real_between(0.01, 100))->capture_default_str();
  cmd->add_option("--repeat-last-n", s.repeat_last_n, "Tokens (prompt and generated) the penalties look back on "
                                                      "(0 = off, -1 = all)")
      ->check(int_at_least(-1))->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Subtract this x the token's count in the last "
                                                              "--repeat-last-n tokens from its logit (0 = off)")
      ->check(real_between(-2, 2))->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "Subtract this once from the logit of a token seen in the "
                                                            "last --repeat-last-n tokens (0 = off)")
      ->check(real_between(-2, 2))->capture_default_str();
}

struct Loaded {
  Checkpoint model;
  std::unique_ptr<eng::Tokenizer> tokenizer;
};

Loaded load(const ModelSettings& m, bool quiet) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string checkpoint = resolve_checkpoint(m.model);
  const std::string tok = m.tokenizer.empty() ? tokenizer_beside(checkpoint) : m.tokenizer;
  if (!quiet) std::fprintf(stderr, "loading %s (tokenizer %s) ...\n", checkpoint.c_str(), tok.c_str());
  eng::LoadProgress progress;
  if (!quiet && isatty(STDERR_FILENO)) {  // a redrawn line is noise in a log
    progress = [](int done, int total) {
      std::fprintf(stderr, "\r  layer %d/%d", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  Loaded l{load_model_checkpoint(checkpoint, m.tp, progress), nullptr};
  l.tokenizer = eng::load_tokenizer(tok);
  if (l.tokenizer->vocab_size() > l.model.config.vocab_size) {
    throw Error(ErrorKind::invalid_value, "tokenizer '" + tok + "' has " + std::to_string(l.tokenizer->vocab_size()) +
                                              " tokens but the model's vocabulary is " + std::to_string(l.model.config.vocab_size));
  }
  if (!quiet) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%s\n%zu parameters, tokenizer %s, loaded in %.2f s\n", l.model.config.summary().c_str(),
                 eng::parameter_count(l.model.config), l.tokenizer->kind().c_str(), s);
  }
  return l;
}

eng::GenerationParams gen_params(const SamplingSettings& s, const std::vector<int>& stops) {
  eng::GenerationParams p;
  p.max_new_tokens = s.max_tokens;
  p.sampling = {s.temperature, s.top_k, s.top_p, s.seed, s.repeat_penalty, s.repeat_last_n, s.frequency_penalty,
                s.presence_penalty};
  p.sampling.validate();
  p.stop_ids = stops;
  return p;
}

// A model's vocabulary may be padded past the tokenizer's; such ids (never seen in training) print as nothing.
std::string piece_of(const eng::Tokenizer& tok, int id) {
  return id >= 0 && id < tok.vocab_size() ? tok.decode_token(id) : std::string();
}

// The text of token `id` following token `prev`: SentencePiece tokenizers put a dummy-prefix space on the first piece
// of a sequence, dropped only right after BOS (llama2.c's rule); elsewhere a piece keeps its space ("park" " with").
std::string piece_after(const eng::Tokenizer& tok, int prev, int id, int bos) {
  std::string piece = piece_of(tok, id);
  if (prev == bos && tok.adds_dummy_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  return piece;
}

// The text the generated ids add after the prompt: what the stream prints, piece by piece.
std::string continuation_text(const eng::Tokenizer& tok, const std::vector<int>& prompt, const std::vector<int>& ids,
                              int bos) {
  std::string text;
  int prev = prompt.empty() ? bos : prompt.back();
  for (int id : ids) text += piece_after(tok, prev, id, bos), prev = id;
  return text;
}

int bos_of(const Loaded& l) {
  return l.model.config.bos_id >= 0 ? l.model.config.bos_id : l.tokenizer->bos_id();
}

std::vector<int> stop_ids_of(const Loaded& l) {
  std::vector<int> stops = l.model.config.eos_ids;
  for (const char* name : {"<|eot_id|>", "<|end_of_text|>"}) {
    if (auto id = l.tokenizer->token_id(name); id && std::find(stops.begin(), stops.end(), *id) == stops.end()) stops.push_back(*id);
  }
  return stops;
}

json stats_json(const eng::GenerationStats& st, eng::LlamaModel& model) {
  return {{"batch", st.batch},
          {"prompt_tokens", st.prompt_tokens},
          {"generated_tokens", st.generated_tokens},
          {"ttft_ms", st.ttft_ms},
          {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
          {"mean_tbt_ms", st.mean_tbt_ms()},
          {"median_tbt_ms", st.median_tbt_ms()},
          {"step_ms", st.step_ms},  // each decode step's time: stalls show here, not in the median
          {"decode_tokens_per_s", st.decode_tokens_per_s()},
          {"total_ms", st.total_ms},
          {"peak_rss_bytes", eng::peak_rss_bytes()},
          {"device_bytes", model.device_bytes()},
          {"threads", model.threads()},
          {"attention_kernel", model.attention_kernel()},
          {"device", model.device()}};
}

void print_stats(const eng::GenerationStats& st, const eng::LlamaModel& model) {
  std::fprintf(stderr,
               "[batch %d, prompt %d tokens, generated %d] TTFT %.3f ms (prefill %.0f tok/s), time between tokens "
               "mean %.4f ms median %.4f ms, decode %.1f tok/s, peak memory %.1f MiB, %d thread(s)\n",
               st.batch, st.prompt_tokens, st.generated_tokens, st.ttft_ms, st.prefill_tokens_per_s(), st.mean_tbt_ms(),
               st.median_tbt_ms(), st.decode_tokens_per_s(), eng::peak_rss_bytes() / 1048576.0, model.threads());
}

// Refuses, before the model allocates it, a context past the model's maximum or a KV cache that cannot fit in memory
// (the CPU's: fp32 K and V per layer, sequence and position, plus a logits row per sequence).
// The runtime options every engine command takes from its flags (slots and context are the command's).
eng::RuntimeOptions runtime_options(const ModelSettings& m) {
  eng::RuntimeOptions ro;
  ro.threads = m.threads;
  ro.tp = m.tp;
  ro.attention = parse_backend(m.attention);
  ro.precision = m.precision;
  ro.cuda.graphs = !m.no_graphs;
  ro.cuda.profile = m.profile;
  ro.cuda.one_shot_allreduce = !m.nccl_only;
  ro.cuda.verbose = m.verbose;
  return ro;
}

void check_runtime_fits(const eng::ModelConfig& c, const eng::RuntimeOptions& ro, const std::string& device) {
  if (ro.context > c.max_seq_len) {
    throw Error(ErrorKind::invalid_value, "--context " + std::to_string(ro.context) + " exceeds the model's maximum of " +
                                              std::to_string(c.max_seq_len) + " positions");
  }
  if (device != "cpu") return;  // the CUDA model checks the device's memory itself
  const int64_t kv = checked_product({2, c.n_layers, ro.slots, ro.context, c.kv_dim(), 4});
  const int64_t logits = checked_product({ro.slots, c.vocab_size, 4});
  const bool batch = ro.slots > 1;
  require_memory(checked_sum(kv, logits),
                 "the KV cache of " + (batch ? std::to_string(ro.slots) + " sequences (--batch) x " : std::string()) +
                     std::to_string(ro.context) + " positions (--context)",
                 batch ? "lower --batch or --context" : "lower --context");
}

// Says on stderr why a sequence ended before its --max-tokens: its context filled up (finish_reason "context").
void report_context_stops(const eng::GenerationResult& r, int asked, int context, int model_max) {
  for (size_t b = 0; b < r.finish_reason.size(); ++b) {
    if (r.finish_reason[b] != "context") continue;
    const std::string who = r.finish_reason.size() > 1 ? "sequence " + std::to_string(b) + " " : "";
    const std::string advice = context < model_max
                                   ? "; pass --context N (up to " + std::to_string(model_max) + ", the model's maximum)"
                                   : " (the model's maximum); a shorter prompt leaves more room";
    std::fprintf(stderr, "%sstopped after %zu of %d tokens: the context of %d positions is full%s\n", who.c_str(),
                 r.tokens[b].size(), asked, context, advice.c_str());
  }
}

std::string read_stdin() { return std::string(std::istreambuf_iterator<char>(std::cin), {}); }

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

// ---- generate ----
struct GenerateSettings {
  ModelSettings m;
  SamplingSettings s;
  std::vector<std::string> prompts;
  bool no_bos = false, special = false;
  int prompt_tokens = 0;  // benchmarks: prompts of exactly this many tokens (BOS + random ids)
  int batch = 0;          // benchmarks: repeat the prompts up to this many sequences
  bool ignore_eos = false;
  int warmup = 0;         // benchmarks: untimed runs first (CUDA context, cuBLASLt plans, lazy module loading)
};

void run_generate(const GenerateSettings& g) {
  Loaded l = load(g.m, g.m.json_out);
  std::vector<std::string> texts = g.prompts.empty() ? std::vector<std::string>{""} : g.prompts;
  const size_t given = texts.size();
  for (size_t b = given; int(b) < g.batch; ++b) texts.push_back(texts[b % given]);
  const int max_ctx = l.model.config.max_seq_len;
  if (g.prompt_tokens > max_ctx) {
    throw Error(ErrorKind::invalid_value, "--prompt-tokens " + std::to_string(g.prompt_tokens) +
                                              " exceeds the model's context of " + std::to_string(max_ctx) + " positions");
  }
  std::vector<std::vector<int>> prompts;
  const int bos = g.no_bos ? -1 : bos_of(l);
  size_t longest = 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  for (const std::string& t : texts) {
    std::vector<int> ids;
    if (bos >= 0) ids.push_back(bos);
    std::vector<int> enc = l.tokenizer->encode(t, g.special);
    if (g.prompt_tokens > 0) {  // synthetic prompt: random ordinary tokens, a different one per sequence
      enc.clear();
      while (int(ids.size() + enc.size()) < g.prompt_tokens) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        const int id = 3 + int(rng % uint64_t(std::max(1, l.tokenizer->vocab_size() - 300)));
        if (!l.tokenizer->is_special(id)) enc.push_back(id);
      }
    }
    ids.insert(ids.end(), enc.begin(), enc.end());
    if (ids.empty()) {
      throw Error(ErrorKind::invalid_value, std::string("prompt is empty and no BOS token starts it (") +
                                                (g.no_bos ? "--no-bos" : "the model and tokenizer name none") +
                                                "); pass a non-empty --prompt");
    }
    longest = std::max(longest, ids.size());
    prompts.push_back(std::move(ids));
  }
  if (int(longest) > max_ctx) {
    throw Error(ErrorKind::invalid_value, "prompt has " + std::to_string(longest) + " tokens; the model's context holds " +
                                              std::to_string(max_ctx));
  }
  eng::RuntimeOptions ro = runtime_options(g.m);
  ro.slots = int(prompts.size());
  // (int64: a huge --max-tokens must not wrap around to a small context)
  ro.context = g.m.context > 0 ? g.m.context : int(std::min<int64_t>(max_ctx, int64_t(longest) + g.s.max_tokens));
  check_runtime_fits(l.model.config, ro, g.m.device);
  std::unique_ptr<eng::LlamaModel> model_ptr = make_model(l.model, ro, g.m.device);
  eng::LlamaModel& model = *model_ptr;
  const bool stream = !g.m.json_out && prompts.size() == 1;
  if (stream) {
    std::fwrite(texts[0].data(), 1, texts[0].size(), stdout);
    std::fflush(stdout);
  }
  int prev = prompts[0].back();
  auto on_token = [&](int seq, int tok) {
    if (!stream || seq != 0) return;
    const std::string piece = piece_after(*l.tokenizer, prev, tok, bos);
    prev = tok;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  const eng::GenerationParams params = gen_params(g.s, g.ignore_eos ? std::vector<int>{} : stop_ids_of(l));
  for (int w = 0; w < g.warmup; ++w) {  // same prompts, a few steps; generate() resets the slots again below
    eng::GenerationParams wp = params;
    wp.max_new_tokens = std::min(params.max_new_tokens, 4);
    eng::generate(model, prompts, wp);
  }
  eng::GenerationResult r = eng::generate(model, prompts, params, on_token);
  if (stream) std::fputc('\n', stdout);  // the text ends its line, so a shell prompt or the next output starts clean
  std::fflush(stdout);
  report_context_stops(r, g.s.max_tokens, model.context(), max_ctx);
  if (g.m.json_out) {
    json outs = json::array();
    for (size_t b = 0; b < prompts.size(); ++b) {
      outs.push_back({{"prompt", texts[b]}, {"prompt_ids", prompts[b]}, {"ids", r.tokens[b]},
                      {"text", continuation_text(*l.tokenizer, prompts[b], r.tokens[b], bos)}, {"finish_reason", r.finish_reason[b]}});
    }
    std::cout << dump({{"model", g.m.model}, {"outputs", outs}, {"stats", stats_json(r.stats, model)}}) << "\n";
    return;
  }
  if (!stream) {
    for (size_t b = 0; b < prompts.size(); ++b) std::cout << "[" << b << "] " << texts[b] << continuation_text(*l.tokenizer, prompts[b], r.tokens[b], bos) << "\n";
  }
  std::cout << std::flush;
  print_stats(r.stats, model);
}

// ---- chat ----
struct ChatSettings {
  ModelSettings m;
  SamplingSettings s;
  std::string system;
};

void run_chat(const ChatSettings& c) {
  Loaded l = load(c.m, false);
  eng::RuntimeOptions ro = runtime_options(c.m);
  ro.context = c.m.context > 0 ? c.m.context : std::min(l.model.config.max_seq_len, 4096);
  check_runtime_fits(l.model.config, ro, c.m.device);
  std::unique_ptr<eng::LlamaModel> model_ptr = make_model(l.model, ro, c.m.device);
  eng::LlamaModel& model = *model_ptr;
  eng::ChatSession session(model);
  eng::ChatFormatter fmt(*l.tokenizer, bos_of(l), c.system);
  std::fprintf(stderr, "chat (%s); /reset clears the conversation, /exit or end of input quits\n", fmt.description().c_str());
  const bool tty = isatty(0);
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      session.reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    std::vector<int> turn = fmt.user_turn(line, session.empty());  // BOS and system prompt while the session is empty
    auto on_token = [&](int, int tok) {
      const std::string piece = piece_of(*l.tokenizer, tok);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
    try {
      eng::GenerationResult r = session.turn(turn, gen_params(c.s, stop_ids_of(l)), on_token);
      std::cout << std::endl;
      if (r.finish_reason[0] == "context") {
        std::fprintf(stderr, "(the context of %d positions is full: /reset starts over; --context sets its size)\n",
                     model.context());
      }
      std::fprintf(stderr, "[%d tokens, TTFT %.2f ms, %.1f tok/s, %d cached]\n", r.stats.generated_tokens, r.stats.ttft_ms,
                   r.stats.decode_tokens_per_s(), session.cached_tokens());
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s (use /reset to start over)\n", e.what());
    }
  }
}

// ---- score (teacher forcing) ----
struct ScoreSettings {
  ModelSettings m;
  std::string ids, text, out;
  int decode_from = -1;  // positions from here on are fed one at a time (exercises the decode path)
};

// Writes a float32 array (rows, cols) as a .npy file.
void write_npy(const std::string& path, const std::vector<float>& data, size_t rows, size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(ErrorKind::invalid_value, "cannot write --out '" + path + "'");
  const uint16_t len = uint16_t(header.size());
  std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  std::fwrite(&len, 2, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  const size_t written = std::fwrite(data.data(), 4, data.size(), f);
  if (std::fclose(f) != 0 || written != data.size()) throw Error(ErrorKind::runtime, "writing '" + path + "' failed");
}

void run_score(const ScoreSettings& sc) {
  ModelSettings m = sc.m;
  const std::vector<int64_t> given = parse_int_list(sc.ids, "--ids");  // before the model loads: typos fail at once
  std::unique_ptr<eng::Tokenizer> tok;
  const std::string checkpoint = resolve_checkpoint(m.model);
  const Checkpoint w = load_model_checkpoint(checkpoint, m.tp);
  std::vector<int> ids;
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i] < 0 || given[i] >= w.config.vocab_size) {
      throw Error(ErrorKind::invalid_value, "--ids element " + std::to_string(i + 1) + " is " + std::to_string(given[i]) +
                                                "; expected a token id in [0, " + std::to_string(w.config.vocab_size) + ")");
    }
    ids.push_back(int(given[i]));
  }
  if (ids.size() > size_t(w.config.max_seq_len)) {
    throw Error(ErrorKind::invalid_value, "--ids holds " + std::to_string(ids.size()) + " tokens; the model's context holds " +
                                              std::to_string(w.config.max_seq_len));
  }
  if (ids.empty()) {
    tok = eng::load_tokenizer(m.tokenizer.empty() ? tokenizer_beside(checkpoint) : m.tokenizer);
    const int bos = w.config.bos_id >= 0 ? w.config.bos_id : tok->bos_id();
    if (bos >= 0) ids.push_back(bos);
    for (int t : tok->encode(sc.text, false)) ids.push_back(t);
  }
  if (ids.empty()) throw Error(ErrorKind::invalid_value, "nothing to score: pass --ids or --text");
  eng::RuntimeOptions ro = runtime_options(m);
  ro.context = m.context > 0 ? m.context : std::min<int>(w.config.max_seq_len, int(ids.size()));
  check_runtime_fits(w.config, ro, m.device);
  std::unique_ptr<eng::LlamaModel> model = make_model(w, ro, m.device);
  const size_t split = sc.decode_from < 0 ? ids.size() : std::min<size_t>(ids.size(), std::max(1, sc.decode_from));
  std::vector<float> logits = model->forward({{0, std::vector<int>(ids.begin(), ids.begin() + split), true}});
  for (size_t i = split; i < ids.size(); ++i) {
    const std::vector<float>& row = model->forward({{0, {ids[i]}, true}});
    logits.insert(logits.end(), row.begin(), row.end());
  }
  write_npy(sc.out, logits, ids.size(), size_t(w.config.vocab_size));
  std::cout << json({{"positions", ids.size()}, {"vocab", w.config.vocab_size}, {"out", sc.out}, {"device", model->device()},
                     {"attention_kernel", model->attention_kernel()}, {"ids", ids}})
                   .dump()
            << "\n";
}

// ---- tokenize ----
struct TokenizeSettings {
  std::string model, text;
  bool has_text = false, json_out = false, special = false, bos = false, jsonl = false;
};

void run_tokenize(const TokenizeSettings& t) {
  std::unique_ptr<eng::Tokenizer> tok = eng::load_tokenizer(resolve_tokenizer(t.model));
  if (t.jsonl) {  // many texts per load (tests): one JSON string per input line -> one JSON object per output line
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      json in;
      try {
        in = json::parse(line);
      } catch (const json::exception& e) {
        throw Error(ErrorKind::invalid_value, std::string("--jsonl input line is not JSON: ") + e.what());
      }
      if (!in.is_string()) throw Error(ErrorKind::invalid_value, "--jsonl input line is not a JSON string");
      const std::vector<int> ids = tok->encode(in.get<std::string>(), t.special);
      std::cout << json({{"ids", ids}, {"decoded", tok->decode(ids)}}).dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    return;
  }
  const std::string text = t.has_text ? t.text : read_stdin();
  std::vector<int> ids;
  if (t.bos && tok->bos_id() >= 0) ids.push_back(tok->bos_id());
  std::vector<int> enc = tok->encode(text, t.special);
  ids.insert(ids.end(), enc.begin(), enc.end());
  if (t.json_out) {
    json pieces = json::array();
    for (int id : ids) pieces.push_back(tok->decode_token(id));
    std::cout << dump({{"ids", ids}, {"count", ids.size()}, {"pieces", pieces}, {"decoded", tok->decode(ids)},
                       {"tokenizer", tok->kind()}})
              << "\n";
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
}

}  // namespace

void add_engine_commands(CLI::App& app) {
  auto g = std::make_shared<GenerateSettings>();
  auto* gen = app.add_subcommand("generate", "Generate text with a Llama model (Hugging Face directory or llama2.c .bin)");
  add_model_options(gen, g->m);
  add_sampling_options(gen, g->s);
  gen->add_option("-p,--prompt", g->prompts, "Prompt text; repeat for a batch of prompts");
  gen->add_flag("--no-bos", g->no_bos, "Do not prepend the BOS token");
  gen->add_flag("--special", g->special, "Parse special-token strings in the prompt (e.g. <|eot_id|>)");
  gen->add_option("--prompt-tokens", g->prompt_tokens, "Benchmarks: use prompts of exactly N tokens (BOS + random ids)")
      ->check(int_between(0, kMaxPositions));
  gen->add_flag("--ignore-eos", g->ignore_eos, "Do not stop at stop tokens (benchmarks, parity runs)");
  gen->add_option("--batch", g->batch, "Benchmarks: repeat the prompts up to this many sequences")
      ->check(int_between(0, kMaxSequences));
  gen->add_option("--warmup", g->warmup, "Benchmarks: untimed runs (a few tokens each) before the measured one")
      ->check(int_between(0, 1000));
  gen->callback([g] { run_generate(*g); });

  auto c = std::make_shared<ChatSettings>();
  auto* chat = app.add_subcommand("chat", "Interactive chat (Llama 3 template; llama2.c models continue the text)");
  add_model_options(chat, c->m);
  add_sampling_options(chat, c->s);
  chat->add_option("--system", c->system, "System prompt (Llama 3 template)");
  chat->callback([c] { run_chat(*c); });

  auto sc = std::make_shared<ScoreSettings>();
  auto* score = app.add_subcommand("score", "Teacher-forced logits of every position, written to a .npy file (for parity tests)");
  add_model_options(score, sc->m);
  score->add_option("--ids", sc->ids, "Token ids in [0, vocab), comma or space separated");
  score->add_option("--text", sc->text, "Text to score (tokenized with BOS) when --ids is absent");
  score->add_option("--out", sc->out, "Output .npy file (positions, vocab) float32")->required();
  score->add_option("--decode-from", sc->decode_from, "Feed positions from here on one at a time (the decode path)")
      ->check(int_at_least(-1));
  score->callback([sc] { run_score(*sc); });

  auto t = std::make_shared<TokenizeSettings>();
  auto* tk = app.add_subcommand("tokenize", "Print the token ids of a text (from --text or standard input)");
  tk->add_option("-m,--model", t->model, "Tokenizer: a directory with tokenizer.json (or GPT-2 files, or one llama2.c "
                                         "tok*.bin), a tokenizer.json or a llama2.c .bin")->required();
  tk->add_option("--text", t->text, "Text to tokenize (default: standard input)")->each([t](const std::string&) { t->has_text = true; });
  tk->add_flag("--json", t->json_out, "Print ids, pieces and the decoded text as JSON");
  tk->add_flag("--special", t->special, "Parse special-token strings (e.g. <|begin_of_text|>) as their ids");
  tk->add_flag("--bos", t->bos, "Prepend the BOS token");
  tk->add_flag("--jsonl", t->jsonl, "Batch mode: each standard-input line is a JSON string; prints one JSON object per line");
  tk->callback([t] { run_tokenize(*t); });
}

}  // namespace flashlite::cli
