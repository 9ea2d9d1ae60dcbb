// `flashlite attn`: one attention call with every option, checked against the float64 reference and timed.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "attn_runner.h"
#include "cli_checks.h"
#include "commands.h"

namespace flashlite::cli {

static void print_table(const AttnReport& r) {
  std::printf("flashlite attn on %s\n", r.device.c_str());
  std::printf("  problem   batch %lld, q_heads %lld, kv_heads %lld, seq_q %lld, seq_k %lld, head_dim %lld, %s\n",
              (long long)r.batch, (long long)r.heads, (long long)r.kv_heads, (long long)r.seq_q, (long long)r.seq_k,
              (long long)r.head_dim, r.dtype.c_str());
  std::printf("  backend   %s (kernel %s)\n", r.backend.c_str(), r.kernel.c_str());
  std::printf("  time      median %.4f ms, min %.4f ms\n", r.median_ms, r.min_ms);
  std::printf("  speed     %.2f GFLOP/s (%.3g useful FLOPs per call)\n", r.flops / (r.median_ms * 1e6), r.flops);
  if (r.checked) {
    std::printf("  check     max abs err %.3e, rel err %.3e, lse max abs err %.3e  [%s, tolerance %s]\n",
                r.max_abs_err, r.rel_err, r.lse_max_abs_err, r.passed ? "PASS" : "FAIL", r.tolerance.c_str());
  } else {
    std::printf("  check     skipped (--no-check)\n");
  }
}

static void print_json(const AttnReport& r) {
  nlohmann::json j = {{"device", r.device},       {"backend", r.backend},   {"kernel", r.kernel},
                      {"dtype", r.dtype},         {"batch", r.batch},       {"heads", r.heads},
                      {"kv_heads", r.kv_heads},   {"seq_q", r.seq_q},       {"seq_k", r.seq_k},
                      {"head_dim", r.head_dim},   {"median_ms", r.median_ms}, {"min_ms", r.min_ms},
                      {"flops", r.flops},         {"gflops_per_s", r.flops / (r.median_ms * 1e6)},
                      {"checked", r.checked}};
  if (r.checked) {
    j["max_abs_err"] = r.max_abs_err;
    j["rel_err"] = r.rel_err;
    j["lse_max_abs_err"] = r.lse_max_abs_err;
    j["passed"] = r.passed;
    j["tolerance"] = r.tolerance;
  }
  std::cout << j.dump(2) << "\n";
}

void add_attn_command(CLI::App& app) {
  auto s = std::make_shared<AttnSettings>();
  auto* cmd = app.add_subcommand("attn", "Run one attention call on random inputs: check it against the float64 "
                                         "reference and time it");
  cmd->add_option("--batch", s->batch, "Batch size (number of sequences)")->check(int_between(1, 1 << 20))->capture_default_str();
  cmd->add_option("--heads", s->heads, "Query heads")->check(int_between(1, 4096))->capture_default_str();
  cmd->add_option("--kv-heads", s->kv_heads, "Key/value heads, dividing --heads (default: --heads; fewer gives GQA/MQA)")
      ->check(int_between(1, 4096));
  cmd->add_option("--seq-q", s->seq_q, "Query length")->check(int_between(0, 1 << 24))->capture_default_str();
  cmd->add_option("--seq-k", s->seq_k, "Key length (default: --seq-q; 0: no keys, every row fully masked); causal is "
                                       "bottom-right aligned when they differ")
      ->check(int_between(0, 1 << 24));
  cmd->add_option("--head-dim", s->head_dim, "Head dimension")->check(int_between(1, 1024))->capture_default_str();
  cmd->add_option("--dtype", s->dtype, "Element type: f32, f16, bf16 or auto (bf16 on a GPU, f32 on the CPU)")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16"}))->capture_default_str();
  cmd->add_flag("--causal", s->causal, "Causal mask (bottom-right aligned)");
  cmd->add_option("--window", s->window, "Sliding window: L keys to the left, R to the right (-1 = unlimited; R defaults "
                                         "to unlimited)")
      ->delimiter(',')->expected(1, 2)->type_name("L[,R]")->check(int_at_least(-1));
  cmd->add_option("--sink-tokens", s->sink_tokens, "First N keys stay visible regardless of the window")
      ->type_name("N")->check(int_at_least(0));
  cmd->add_flag("--sink-logits", s->sink_logits, "Random learned per-head sink logits (denominator only)");
  cmd->add_option("--softcap", s->softcap, "Softcap the scores: c * tanh(s / c) (0 = off)")->type_name("C")->check(real_at_least(0));
  cmd->add_flag("--varlen", s->varlen, "Variable-length batch (random lengths up to --seq-q/--seq-k, packed with cu_seqlens)");
  cmd->add_option("--backend", s->backend, "reference, naive, cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "reference", "naive", "cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--device", s->device, "Where naive/auto run: cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--repeat", s->repeat, "Timed runs (median reported)")->check(int_between(1, 100000))->capture_default_str();
  cmd->add_option("--warmup", s->warmup, "Untimed warm-up runs")->check(int_between(0, 100000))->capture_default_str();
  cmd->add_option("--seed", s->seed, "Random seed")->check(unsigned_integer())->capture_default_str();
  cmd->add_flag_callback("--no-check", [s] { s->check = false; }, "Skip the float64 reference check (for big problems)");
  cmd->add_flag("--json", s->json, "Print JSON instead of a table");
  cmd->callback([s] {
    const AttnReport r = run_attention(*s);
    if (s->json) print_json(r); else print_table(r);
    if (!r.passed) throw CLI::RuntimeError("result check failed", 3);
  });
}

}  // namespace flashlite::cli
