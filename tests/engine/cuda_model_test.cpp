// The CUDA engine path against the float64 reference and the CPU engine. Skips where no CUDA device exists (CI);
// run it on the GPU machine. fp32: logits within 1e-3 and greedy tokens identical to the CPU path for 200 steps;
// bf16: logits within bf16 tolerance and the same top-1 on almost every position; batches equal single runs; each
// opt-in engine variant (FLASHLITE_ENGINE_* switches of Round 3) generates the default's greedy tokens. The switch
// parser (engine/cuda_ops/env_switch.h) is tested everywhere, without a device.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>

#include "engine/cuda_ops/env_switch.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;

// The CUDA model, or a skip reason when this build or machine has none.
std::unique_ptr<eng::LlamaModel> cuda_model(const eng::ModelWeights& w, const std::string& precision, int slots,
                                            std::string* why) {
  eng::RuntimeOptions o;
  o.precision = precision;
  o.slots = slots;
  try {
    return eng::create_model(w, o, "cuda");
  } catch (const flashlite::Error& e) {
    *why = e.what();
    return nullptr;
  }
}

#define CUDA_MODEL_OR_SKIP(var, w, precision, slots)             \
  std::string why_##var;                                         \
  auto var = cuda_model(w, precision, slots, &why_##var);        \
  if (!var) GTEST_SKIP() << "no CUDA engine here: " << why_##var

struct Errors {
  double max_abs = 0, max_ref = 0;
  int top1_agree = 0, rows = 0;
};

Errors compare(const std::vector<float>& got, const std::vector<std::vector<double>>& want) {
  Errors e;
  const size_t vocab = want[0].size();
  for (size_t t = 0; t < want.size(); ++t) {
    int ga = 0, wa = 0;
    for (size_t v = 0; v < vocab; ++v) {
      const double g = got[t * vocab + v];
      e.max_abs = std::max(e.max_abs, std::isfinite(g) ? std::abs(g - want[t][v]) : INFINITY);
      e.max_ref = std::max(e.max_ref, std::abs(want[t][v]));
      if (got[t * vocab + v] > got[t * vocab + ga]) ga = int(v);
      if (want[t][v] > want[t][wa]) wa = int(v);
    }
    e.top1_agree += ga == wa;
    ++e.rows;
  }
  return e;
}

TEST(CudaEngine, Stories260KFp32MatchesFloat64AndCpuGreedy) {
  const std::string path = reftest::models_dir() + "/stories260K/stories260K.bin";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model absent: " << path;
  const eng::ModelWeights w = eng::load_checkpoint(path);
  CUDA_MODEL_OR_SKIP(gpu, w, "fp32", 1);
  reftest::RefModel ref;
  ASSERT_TRUE(reftest::read_llama2c(path, ref));
  std::vector<int> tokens{1, 403, 407, 261, 378};
  for (int i = 0; tokens.size() < 60; ++i) tokens.push_back(3 + (i * 37) % 509);
  const Errors e = compare(gpu->forward({{0, tokens, true}}), reftest::forward_all(ref, tokens));
  EXPECT_LT(e.max_abs, 1e-3) << "fp32 logits vs float64";
  // Greedy, 200 steps, identical to the CPU engine.
  eng::GenerationParams gp;
  gp.max_new_tokens = 200;
  const std::vector<int> prompt{1, 403, 407, 261, 378};
  auto cpu = eng::create_model(w, {}, "cpu");
  EXPECT_EQ(eng::generate(*gpu, {prompt}, gp).tokens[0], eng::generate(*cpu, {prompt}, gp).tokens[0]);
}

TEST(CudaEngine, SyntheticBf16HeadDim64WithinTolerance) {
  const synth::Spec spec{"cuda_bf16", 256, 512, 2, 4, 2, 64, 300, "BF16", false, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  const reftest::RefModel ref = synth::write_checkpoint(dir, spec, 77);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  CUDA_MODEL_OR_SKIP(gpu, w, "bf16", 1);
  std::vector<int> tokens;
  for (int i = 0; i < 100; ++i) tokens.push_back((i * 131 + 7) % spec.vocab);
  const auto want = reftest::forward_all(ref, tokens);
  // Prefill 64 then decode one at a time.
  std::vector<float> got = gpu->forward({{0, std::vector<int>(tokens.begin(), tokens.begin() + 64), true}});
  for (size_t t = 64; t < tokens.size(); ++t) {
    const auto& row = gpu->forward({{0, {tokens[t]}, true}});
    got.insert(got.end(), row.begin(), row.end());
  }
  const Errors e = compare(got, want);
  std::printf("bf16 vs float64: max abs %.4g (logits up to %.3g), top-1 agreement %d/%d\n", e.max_abs, e.max_ref,
              e.top1_agree, e.rows);
  EXPECT_LT(e.max_abs, 0.05 * e.max_ref);
  EXPECT_GE(e.top1_agree, int(0.9 * e.rows));
  std::filesystem::remove_all(dir);
}

TEST(CudaEngine, BatchOfDifferentLengthsEqualsSingleRuns) {
  const std::string path = reftest::models_dir() + "/stories260K/stories260K.bin";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model absent: " << path;
  const eng::ModelWeights w = eng::load_checkpoint(path);
  CUDA_MODEL_OR_SKIP(batch, w, "fp32", 3);
  const std::vector<std::vector<int>> prompts = {{1, 403, 407, 261, 378}, {1, 300}, {1, 400, 401, 402, 403, 404, 405, 406, 407}};
  eng::GenerationParams gp;
  gp.max_new_tokens = 40;
  const auto batched = eng::generate(*batch, prompts, gp);
  for (size_t b = 0; b < prompts.size(); ++b) {
    CUDA_MODEL_OR_SKIP(single, w, "fp32", 1);
    EXPECT_EQ(batched.tokens[b], eng::generate(*single, {prompts[b]}, gp).tokens[0]) << "sequence " << b;
  }
}

// The generation loop on the CUDA model (ids or top-k candidates selected on the device) against a loop over the
// full host logits of a second, identical model with the host sampler: the same tokens, greedy and seeded top-k,
// for a batch (several rows through the fused GEMVs) and for one sequence.
std::vector<std::vector<int>> host_sampled(eng::LlamaModel& m, const std::vector<std::vector<int>>& prompts,
                                           const eng::GenerationParams& gp) {
  const int B = int(prompts.size()), vocab = m.config().vocab_size;
  std::vector<eng::Sampler> samplers;
  std::vector<eng::SequenceInput> step;
  for (int b = 0; b < B; ++b) {
    m.reset(b);
    samplers.emplace_back(gp.sampling, b);
    step.push_back({b, prompts[b], false});
  }
  std::vector<std::vector<int>> out(B);
  for (int t = 0; t < gp.max_new_tokens; ++t) {
    const std::vector<float>& logits = m.forward(step);
    for (int b = 0; b < B; ++b) {
      out[b].push_back(samplers[b].sample(logits.data() + size_t(b) * vocab, vocab));
      step[b].tokens = {out[b].back()};
    }
  }
  return out;
}

TEST(CudaEngine, DeviceSelectionGeneratesTheHostSamplersTokens) {
  const synth::Spec spec{"cuda_select", 256, 512, 2, 4, 2, 64, 3000, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 91);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 200, 17}, {1, 2999}, {1, 7, 7, 7, 8, 9, 10, 11, 12, 13, 14}};
  for (const auto& sp : {eng::SamplingParams{0.f, 0, 1.f, 0}, eng::SamplingParams{0.9f, 20, 0.95f, 7},
                         eng::SamplingParams{1.0f, 0, 0.9f, 3}}) {
    for (size_t batch : {size_t(1), prompts.size()}) {
      CUDA_MODEL_OR_SKIP(dev, w, "bf16", int(prompts.size()));
      CUDA_MODEL_OR_SKIP(host, w, "bf16", int(prompts.size()));
      eng::GenerationParams gp;
      gp.max_new_tokens = 24;
      gp.sampling = sp;
      const std::vector<std::vector<int>> ps(prompts.begin(), prompts.begin() + batch);
      const auto got = eng::generate(*dev, ps, gp);
      const auto want = host_sampled(*host, ps, gp);
      for (size_t b = 0; b < batch; ++b)
        EXPECT_EQ(got.tokens[b], want[b]) << "temperature " << sp.temperature << " top_k " << sp.top_k << " batch "
                                          << batch << " sequence " << b;
    }
  }
  std::filesystem::remove_all(dir);
}

// Sets environment variables for a scope (the CUDA model reads its variant switches when it is built).
using ScopedEnvVars = std::vector<std::pair<std::string, std::string>>;
class ScopedEnv {
 public:
  explicit ScopedEnv(const ScopedEnvVars& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) setenv(name.c_str(), old->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The defaults against the baseline with every switch off, each switch alone against that baseline, and the
// bit-preserving switches on top of the defaults against the defaults, on one bf16 model: the same greedy tokens for
// one sequence and a batch of three (decode steps replayed from graphs, several rows through the GEMVs). Switches
// that keep every rounding (fused argmax, preload, late trigger, PDL off, profile modes) must match exactly; those
// that reorder fp32 sums or may round differently (split-K, forced decode splits, fused RoPE, the combinations, the
// defaults against the baseline) may part only where the reference's own logits are a near tie (checked by
// teacher-forcing the reference model up to the first difference). Then logits within the bf16 tolerance of float64,
// prefill + decode, with the variant on (the baseline included).
TEST(CudaEngine, VariantSwitchesGenerateTheDefaultTokens) {
  const synth::Spec spec{"cuda_variants", 256, 1024, 2, 4, 2, 64, 3000, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  const reftest::RefModel ref = synth::write_checkpoint(dir, spec, 101);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 200, 17}, {1, 2999}, {1, 7, 7, 7, 8, 9, 10, 11, 12, 13, 14}};
  eng::GenerationParams gp;
  gp.max_new_tokens = 32;
  // Every switch cleared (empty = its default), so the caller's environment cannot change what "defaults" means; the
  // baseline: all switches off (the defaults are a combination of them).
  using Env = std::vector<std::pair<std::string, std::string>>;
  const Env defaults_env = {
      {"FLASHLITE_ENGINE_SPLITK", ""},   {"FLASHLITE_ENGINE_FUSE_ROPE", ""},   {"FLASHLITE_ENGINE_FUSE_ARGMAX", ""},
      {"FLASHLITE_ENGINE_PRELOAD", ""},  {"FLASHLITE_ENGINE_PREFETCH", ""},    {"FLASHLITE_ENGINE_PDL", ""},
      {"FLASHLITE_ENGINE_PDL_TRIGGER", ""}, {"FLASHLITE_ENGINE_DECODE_SPLITS", ""}, {"FLASHLITE_ENGINE_PROFILE", ""},
      {"FLASHLITE_ENGINE_GRAPH", ""},    {"FLASHLITE_ENGINE_GEMV", ""},        {"FLASHLITE_ENGINE_STREAM", ""},
      {"FLASHLITE_ENGINE_STREAM_STAGES", ""}, {"FLASHLITE_ENGINE_STREAM_BLOCKS", ""},
      {"FLASHLITE_ENGINE_NORM_EARLY", ""}, {"FLASHLITE_ENGINE_TIMELINE", ""},
      {"FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST", ""}, {"FLASHLITE_ENGINE_GATEUP_GRID", ""},
      {"FLASHLITE_ENGINE_LMHEAD_GRID", ""}, {"FLASHLITE_ENGINE_DOWN_GRID", ""}};
  // `over` with the entries of `base` it does not set.
  const auto merged = [](const Env& over, const Env& base) {
    Env env = over;
    for (const auto& kv : base) {
      bool set = false;
      for (const auto& mine : over) set = set || mine.first == kv.first;
      if (!set) env.push_back(kv);
    }
    return env;
  };
  const Env plain_env = merged({{"FLASHLITE_ENGINE_SPLITK", "0"}, {"FLASHLITE_ENGINE_FUSE_ROPE", "0"},
                                {"FLASHLITE_ENGINE_FUSE_ARGMAX", "0"}, {"FLASHLITE_ENGINE_PRELOAD", "0"}},
                               defaults_env);
  std::vector<std::vector<std::vector<int>>> want[2];  // [on defaults][batch kind][sequence]
  for (int on_defaults = 0; on_defaults < 2; ++on_defaults) {
    ScopedEnv base_env(on_defaults ? defaults_env : plain_env);
    CUDA_MODEL_OR_SKIP(base, w, "bf16", int(prompts.size()));
    want[on_defaults].push_back(eng::generate(*base, {prompts[0]}, gp).tokens);
    want[on_defaults].push_back(eng::generate(*base, prompts, gp).tokens);
  }
  std::vector<int> probe;
  for (int i = 0; i < 80; ++i) probe.push_back((i * 173 + 11) % spec.vocab);
  const auto probe_want = reftest::forward_all(ref, probe);
  struct V {
    Env env;            // on top of the base environment
    bool exact;         // the same tokens as the reference, else parting only at a near tie of its logits
    bool on_defaults;   // base environment: the defaults, else all switches off
    bool ref_defaults;  // reference tokens: the defaults', else the baseline's
  };
  const std::vector<V> variants = {
      {{}, true, false, false},  // the baseline itself: its logits against float64 below
      // The defaults (split-K auto, fused RoPE, fused argmax, preload) against the baseline, then the
      // bit-preserving switches on top of the defaults against the defaults.
      {{}, false, true, false},
      {{{"FLASHLITE_ENGINE_PDL_TRIGGER", "late"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_PROFILE", "1"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_PROFILE", "range"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_PDL", "0"}}, true, true, true},
      // The streamed GEMV (one-row steps) adds its sums in another order: near ties only.
      {{{"FLASHLITE_ENGINE_STREAM", "1"}}, false, true, true},
      {{{"FLASHLITE_ENGINE_STREAM", "1"}, {"FLASHLITE_ENGINE_STREAM_STAGES", "16"}, {"FLASHLITE_ENGINE_STREAM_BLOCKS", "3"}},
       false, true, true},
      {{{"FLASHLITE_ENGINE_STREAM", "1"}, {"FLASHLITE_ENGINE_PDL", "0"}}, false, true, true},
      // The first batch issued behind the RMSNorm loads: the same sums, the default's tokens exactly.
      {{{"FLASHLITE_ENGINE_PRELOAD", "after"}}, true, true, true},
      // The norm weight loaded after the wait (the default loads it before): the same values, the default's tokens.
      {{{"FLASHLITE_ENGINE_NORM_EARLY", "0"}}, true, true, true},
      // The weights' default L2 policy (the default marks them evict-first): a cache hint, the same tokens exactly.
      {{{"FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST", "0"}}, true, true, true},
      // The gate/up GEMV as one resident wave (the default launches a block per tile at one row) or a block per tile
      // at every row count: the same sums, the default's tokens exactly.
      {{{"FLASHLITE_ENGINE_GATEUP_GRID", "wave"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_GATEUP_GRID", "tiles"}}, true, true, true},
      // The LM head (with the fused argmax) as one resident wave (the default launches a block per tile at one row)
      // or a block per tile at every row count, and the down GEMV per tile: the same sums and keys, the default's
      // tokens exactly.
      {{{"FLASHLITE_ENGINE_LMHEAD_GRID", "wave"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_LMHEAD_GRID", "tiles"}}, true, true, true},
      {{{"FLASHLITE_ENGINE_DOWN_GRID", "tiles"}}, true, true, true},
      // Each switch alone on top of the baseline, against the baseline:
      {{{"FLASHLITE_ENGINE_SPLITK", "1"}}, false, false, false},
      {{{"FLASHLITE_ENGINE_SPLITK", "2"}}, false, false, false},
      {{{"FLASHLITE_ENGINE_SPLITK", "8"}}, false, false, false},
      // Fused RoPE: not demanded bit-exact. Its rotation is the unfused kernel's PTX (mul/mul/sub and mul/fma), but
      // mul.f32 / sub.f32 without .rn may be contracted by ptxas differently in the two kernels (SASS not checked:
      // no cuobjdump on the dev machine); cuda_ops_test counts the bit-equal values. A real RoPE bug still fails the
      // near-tie check and the float64 logits below (review 2026-11-23).
      {{{"FLASHLITE_ENGINE_FUSE_ROPE", "1"}}, false, false, false},
      {{{"FLASHLITE_ENGINE_FUSE_ARGMAX", "1"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_PRELOAD", "1"}, {"FLASHLITE_ENGINE_PREFETCH", "0"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_PRELOAD", "small"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_PDL_TRIGGER", "late"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_DECODE_SPLITS", "1"}}, false, false, false},
      {{{"FLASHLITE_ENGINE_DECODE_SPLITS", "3"}}, false, false, false},
      {{{"FLASHLITE_ENGINE_PROFILE", "1"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_PROFILE", "range"}}, true, false, false},
      {{{"FLASHLITE_ENGINE_SPLITK", "1"}, {"FLASHLITE_ENGINE_FUSE_ROPE", "1"}, {"FLASHLITE_ENGINE_FUSE_ARGMAX", "1"},
        {"FLASHLITE_ENGINE_PRELOAD", "small"}},
       false, false, false},
  };
  for (const V& v : variants) {
    std::string label = v.on_defaults ? "defaults " : "switches off ";
    for (const auto& [n, val] : v.env) label += n + "=" + val + " ";
    SCOPED_TRACE(label);
    const Env& base_env = v.on_defaults ? defaults_env : plain_env;
    const Env& ref_env = v.ref_defaults ? defaults_env : plain_env;
    ScopedEnv scoped(merged(v.env, base_env));
    for (int kind = 0; kind < 2; ++kind) {
      const std::vector<std::vector<int>> ps = kind ? prompts : std::vector<std::vector<int>>{prompts[0]};
      CUDA_MODEL_OR_SKIP(m, w, "bf16", int(prompts.size()));
      const auto got = eng::generate(*m, ps, gp).tokens;
      for (size_t b = 0; b < ps.size(); ++b) {
        const std::vector<int>& g = got[b];
        const std::vector<int>& e = want[v.ref_defaults ? 1 : 0][kind][b];
        ASSERT_EQ(g.size(), e.size());
        size_t t = 0;
        while (t < g.size() && g[t] == e[t]) ++t;
        if (t == g.size()) continue;
        ASSERT_FALSE(v.exact) << "sequence " << b << " (batch " << ps.size() << ") parts from the reference at token " << t;
        // The reference model's logits after the common prefix: the two tokens must be a near tie there.
        ScopedEnv reference(ref_env);
        CUDA_MODEL_OR_SKIP(base, w, "bf16", 1);
        std::vector<int> prefix = ps[b];
        prefix.insert(prefix.end(), e.begin(), e.begin() + t);
        const std::vector<float>& logits = base->forward({{0, prefix, false}});
        float top = logits[0];
        for (float x : logits) top = std::max(top, std::abs(x));
        const float gap = std::abs(logits[e[t]] - logits[g[t]]);
        std::printf("%ssequence %zu parts from the reference at token %zu: logits %.5f vs %.5f (max |logit| %.3f)\n",
                    label.c_str(), b, t, logits[e[t]], logits[g[t]], top);
        EXPECT_LE(gap, 0.01f * top) << "sequence " << b << " token " << t << ": not a near tie";
      }
    }
    // Logits vs float64: prefill 48, then decode one at a time (full logits; no selection).
    CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
    std::vector<float> got = m->forward({{0, std::vector<int>(probe.begin(), probe.begin() + 48), true}});
    for (size_t t = 48; t < probe.size(); ++t) {
      const auto& row = m->forward({{0, {probe[t]}, true}});
      got.insert(got.end(), row.begin(), row.end());
    }
    const Errors e = compare(got, probe_want);
    std::printf("%sbf16 vs float64: max abs %.4g (logits up to %.3g), top-1 %d/%d\n", label.c_str(), e.max_abs, e.max_ref,
                e.top1_agree, e.rows);
    EXPECT_LT(e.max_abs, 0.05 * e.max_ref);
    EXPECT_GE(e.top1_agree, int(0.9 * e.rows));
  }
  std::filesystem::remove_all(dir);
}

// The error a call throws (empty when none): an invalid_value flashlite::Error.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const flashlite::Error& e) {
    EXPECT_EQ(e.kind(), flashlite::ErrorKind::invalid_value) << e.what();
    return e.what();
  }
  return "";
}

namespace es = flashlite::engine::env_switch;

TEST(EngineSwitches, FlagsTakeTheFlagWordsInAnyCaseAndNothingElse) {
  for (const char* v : {"0", "off", "OFF", "False", "no", "No"}) EXPECT_FALSE(es::parse_flag("SW", v, true)) << v;
  for (const char* v : {"1", "on", "On", "TRUE", "yes"}) EXPECT_TRUE(es::parse_flag("SW", v, false)) << v;
  EXPECT_TRUE(es::parse_flag("SW", nullptr, true));  // unset or empty: the default
  EXPECT_FALSE(es::parse_flag("SW", nullptr, false));
  EXPECT_TRUE(es::parse_flag("SW", "", true));
  for (const char* v : {"2", "-1", "00", "offf", "o", " 0", "0 ", "y", "enabled", "none"}) {
    const std::string e = error_of([&] { es::parse_flag("SW", v, true); });
    EXPECT_NE(e.find(std::string("SW=") + v + ";"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find("expected 0, off, false or no (off) or 1, on, true or yes (on)"), std::string::npos) << e;
  }
}

TEST(EngineSwitches, IntegersAreWholeDecimalNumbersInTheirRange) {
  EXPECT_EQ(es::parse_int("N", "32", 7, 0, INT_MAX, "n >= 0"), 32);
  EXPECT_EQ(es::parse_int("N", "0", 7, 0, INT_MAX, "n >= 0"), 0);
  EXPECT_EQ(es::parse_int("N", "+4", 7, 0, INT_MAX, "n >= 0"), 4);
  EXPECT_EQ(es::parse_int("N", "2147483647", 7, 0, INT_MAX, "n >= 0"), INT_MAX);
  EXPECT_EQ(es::parse_int("N", nullptr, 7, 0, INT_MAX, "n >= 0"), 7);
  EXPECT_EQ(es::parse_int("N", "", 7, 0, INT_MAX, "n >= 0"), 7);
  for (const char* v : {"4x", "auto", "-1", " 4", "4 ", "0x10", "1e3", "2147483648", "99999999999999999999", "+", "-"}) {
    const std::string e = error_of([&] { es::parse_int("N", v, 7, 0, INT_MAX, "n >= 0"); });
    EXPECT_EQ(e, std::string("N=") + v + "; expected n >= 0") << v;
  }
  // A set (FLASHLITE_ENGINE_SPLITK's).
  for (int v : {0, 1, 2, 4, 8}) EXPECT_EQ(es::parse_int_in("SK", std::to_string(v).c_str(), 1, {0, 1, 2, 4, 8}, "x"), v);
  EXPECT_EQ(es::parse_int_in("SK", nullptr, 1, {0, 1, 2, 4, 8}, "x"), 1);
  for (const char* v : {"3", "16", "-2", "auto", "4x"})
    EXPECT_EQ(error_of([&] { es::parse_int_in("SK", v, 1, {0, 1, 2, 4, 8}, "0, 1, 2, 4 or 8"); }),
              std::string("SK=") + v + "; expected 0, 1, 2, 4 or 8");
}

TEST(EngineSwitches, EnumerationsTakeExactlyTheirNames) {
  // FLASHLITE_ENGINE_PRELOAD's shape: a flag, small or after.
  const auto preload = es::flag_names(0, 1, {{"small", 2}, {"after", 3}});
  EXPECT_EQ(es::parse_choice("PL", "small", 1, preload, "p"), 2);
  EXPECT_EQ(es::parse_choice("PL", "After", 1, preload, "p"), 3);
  EXPECT_EQ(es::parse_choice("PL", "SMALL", 1, preload, "p"), 2);
  EXPECT_EQ(es::parse_choice("PL", "0", 1, preload, "p"), 0);
  EXPECT_EQ(es::parse_choice("PL", "false", 1, preload, "p"), 0);
  EXPECT_EQ(es::parse_choice("PL", "1", 0, preload, "p"), 1);
  EXPECT_EQ(es::parse_choice("PL", nullptr, 1, preload, "p"), 1);
  for (const char* v : {"smal", "small ", "2", "large"})
    EXPECT_EQ(error_of([&] { es::parse_choice("PL", v, 1, preload, "a flag or small"); }),
              std::string("PL=") + v + "; expected a flag or small");
  // FLASHLITE_ENGINE_PDL_TRIGGER's shape: names only, no flag words.
  const std::vector<es::Name> trigger = {{"early", 0}, {"late", 1}};
  EXPECT_EQ(es::parse_choice("TR", "late", 0, trigger, "t"), 1);
  EXPECT_EQ(es::parse_choice("TR", "early", 1, trigger, "t"), 0);
  EXPECT_EQ(es::parse_choice("TR", "", 0, trigger, "t"), 0);
  for (const char* v : {"1", "on", "later"}) EXPECT_FALSE(error_of([&] { es::parse_choice("TR", v, 0, trigger, "t"); }).empty()) << v;
}

TEST(EngineSwitches, TheEnvironmentReadersParseTheVariable) {
  const char* name = "FLASHLITE_ENGINE_TEST_ONLY_SWITCH";
  unsetenv(name);
  EXPECT_TRUE(es::flag(name, true));
  EXPECT_EQ(es::integer(name, 5, 0, 9, "0..9"), 5);
  setenv(name, "Off", 1);
  EXPECT_FALSE(es::flag(name, true));
  setenv(name, "8", 1);
  EXPECT_EQ(es::integer(name, 5, 0, 9, "0..9"), 8);
  EXPECT_EQ(es::integer_in(name, 1, {0, 8}, "0 or 8"), 8);
  setenv(name, "10", 1);
  EXPECT_EQ(error_of([&] { es::integer(name, 5, 0, 9, "0..9"); }), std::string(name) + "=10; expected 0..9");
  setenv(name, "range", 1);
  EXPECT_EQ(es::choice(name, 0, es::flag_names(0, 1, {{"range", 2}}), "r"), 2);
  unsetenv(name);
}

// The engine's own switches: values that are no documented value fail when the model is built (naming the variable
// and the value); the flag words and the documented names build, and a flag word means what its digit means.
TEST(CudaEngine, SwitchValuesAreCheckedWhenTheModelIsBuilt) {
  const synth::Spec spec{"cuda_switches", 256, 512, 2, 4, 2, 64, 300, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 5);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  CUDA_MODEL_OR_SKIP(probe, w, "bf16", 1);
  probe.reset();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"FLASHLITE_ENGINE_SPLITK", "auto"},     {"FLASHLITE_ENGINE_SPLITK", "4x"},
      {"FLASHLITE_ENGINE_SPLITK", "3"},        {"FLASHLITE_ENGINE_GRAPH", "maybe"},
      {"FLASHLITE_ENGINE_GEMV", "2"},          {"FLASHLITE_ENGINE_PDL", "of"},
      {"FLASHLITE_ENGINE_FUSE_ROPE", "x"},     {"FLASHLITE_ENGINE_FUSE_ARGMAX", "-1"},
      {"FLASHLITE_ENGINE_PRELOAD", "big"},     {"FLASHLITE_ENGINE_PREFETCH", "-1"},
      {"FLASHLITE_ENGINE_PREFETCH", "four"},   {"FLASHLITE_ENGINE_PDL_TRIGGER", "lat"},
      {"FLASHLITE_ENGINE_DECODE_SPLITS", "-2"}, {"FLASHLITE_ENGINE_DECODE_SPLITS", "auto"},
      {"FLASHLITE_ENGINE_PROFILE", "events"},  {"FLASHLITE_ENGINE_VERBOSE", "loud"},
      {"FLASHLITE_ENGINE_STREAM", "2"},        {"FLASHLITE_ENGINE_STREAM_STAGES", "4"},
      {"FLASHLITE_ENGINE_STREAM_BLOCKS", "5"}, {"FLASHLITE_ENGINE_NORM_EARLY", "early"},
      {"FLASHLITE_ENGINE_TIMELINE", "maybe"},  {"FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST", "first"},
      {"FLASHLITE_ENGINE_GATEUP_GRID", "7"},  {"FLASHLITE_ENGINE_LMHEAD_GRID", "all"},
      {"FLASHLITE_ENGINE_DOWN_GRID", "-1"}};
  for (const auto& [name, value] : bad) {
    ScopedEnv env({{name, value}});
    eng::RuntimeOptions o;
    o.precision = "bf16";
    const std::string e = error_of([&] { eng::create_model(w, o, "cuda"); });
    EXPECT_NE(e.find(name + "=" + value + "; expected"), std::string::npos) << name << "=" << value << ": " << e;
  }
#if !FLASHLITE_DECODE_TIMELINE
  {  // the timeline exists only in diagnostic builds: asked for elsewhere, the model says so instead of ignoring it
    ScopedEnv env({{std::string("FLASHLITE_ENGINE_TIMELINE"), std::string("1")}});
    eng::RuntimeOptions o;
    o.precision = "bf16";
    const std::string e = error_of([&] { eng::create_model(w, o, "cuda"); });
    EXPECT_NE(e.find("FLASHLITE_ENGINE_TIMELINE=1 needs a diagnostic build"), std::string::npos) << e;
  }
#endif
  eng::GenerationParams gp;
  gp.max_new_tokens = 12;
  const std::vector<int> prompt = {1, 5, 9, 200, 17};
  const std::vector<std::pair<ScopedEnvVars, ScopedEnvVars>> same = {
      {{{"FLASHLITE_ENGINE_PRELOAD", "false"}, {"FLASHLITE_ENGINE_GRAPH", "off"}, {"FLASHLITE_ENGINE_SPLITK", "+0"}},
       {{"FLASHLITE_ENGINE_PRELOAD", "0"}, {"FLASHLITE_ENGINE_GRAPH", "0"}, {"FLASHLITE_ENGINE_SPLITK", "0"}}},
      {{{"FLASHLITE_ENGINE_FUSE_ROPE", "No"}, {"FLASHLITE_ENGINE_GEMV", "yes"}, {"FLASHLITE_ENGINE_PDL_TRIGGER", "early"}},
       {{"FLASHLITE_ENGINE_FUSE_ROPE", "0"}, {"FLASHLITE_ENGINE_GEMV", "1"}, {"FLASHLITE_ENGINE_PDL_TRIGGER", ""}}},
      {{{"FLASHLITE_ENGINE_PROFILE", "off"}, {"FLASHLITE_ENGINE_VERBOSE", "1"}, {"FLASHLITE_ENGINE_PREFETCH", "4"}},
       {{"FLASHLITE_ENGINE_PROFILE", ""}, {"FLASHLITE_ENGINE_VERBOSE", ""}, {"FLASHLITE_ENGINE_PREFETCH", "4"}}},
  };
  for (const auto& [words, digits] : same) {
    std::vector<std::vector<int>> tokens;
    for (const ScopedEnvVars& vars : {words, digits}) {
      ScopedEnv env(vars);
      CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
      tokens.push_back(eng::generate(*m, {prompt}, gp).tokens[0]);
    }
    EXPECT_EQ(tokens[0], tokens[1]) << words[0].first << "=" << words[0].second;
  }
  std::filesystem::remove_all(dir);
}

// An explicit `--attention cuda` keeps the batched decode kernel (and so the graphs): its probe runs on real scratch.
TEST(CudaEngine, ExplicitCudaAttentionKeepsBatchedDecode) {
  const synth::Spec spec{"cuda_explicit_attention", 256, 512, 2, 4, 2, 64, 300, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 13);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  CUDA_MODEL_OR_SKIP(automatic, w, "bf16", 2);
  eng::RuntimeOptions o;
  o.precision = "bf16";
  o.slots = 2;
  o.attention = flashlite::Backend::cuda;
  auto explicit_cuda = eng::create_model(w, o, "cuda");
  const std::string kernel = automatic->attention_kernel();
  EXPECT_NE(kernel.find("decode"), std::string::npos) << kernel;
  EXPECT_EQ(explicit_cuda->attention_kernel(), kernel);
  eng::GenerationParams gp;
  gp.max_new_tokens = 16;
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 200, 17}, {1, 299}};
  EXPECT_EQ(eng::generate(*explicit_cuda, prompts, gp).tokens, eng::generate(*automatic, prompts, gp).tokens);
  std::filesystem::remove_all(dir);
}

// forward({}) is refused before anything runs (no zero-block launch, no failed graph capture), and the model goes on
// as if it had never been called: decode steps on either side, graphs captured, the same tokens as a fresh model.
TEST(CudaEngine, EmptyInputIsRefusedAndLeavesTheModelWorking) {
  const synth::Spec spec{"cuda_empty_input", 256, 512, 2, 4, 2, 64, 300, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 17);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  CUDA_MODEL_OR_SKIP(fresh, w, "bf16", 1);
  CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
  eng::GenerationParams gp;
  gp.max_new_tokens = 16;
  const std::vector<int> prompt = {1, 5, 9, 200, 17};
  const auto want = eng::generate(*fresh, {prompt}, gp).tokens[0];
  EXPECT_EQ(eng::generate(*m, {prompt}, gp).tokens[0], want);  // graphs captured for one row
  const int cached = m->length(0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(error_of([&] { m->forward({}); }).find("at least one input sequence"), std::string::npos);
    EXPECT_NE(error_of([&] { m->forward_select({}, eng::LogitsRequest{}); }).find("at least one input sequence"),
              std::string::npos);
  }
  EXPECT_EQ(m->length(0), cached);
  EXPECT_EQ(eng::generate(*m, {prompt}, gp).tokens[0], want);
  std::filesystem::remove_all(dir);
}

// A model whose logits hold a NaN (LM-head row 7 of NaN): the GPU's greedy selection refuses the row with the host
// sampler's words, with the argmax fused into the LM head (the default) and as its own kernel, where it used to pick
// among the finite logits; sampling refuses it through the top-k candidates. The CPU engine says the same.
TEST(CudaEngine, NonFiniteLogitsAreRefusedAsOnTheHost) {
  const synth::Spec spec{"cuda_nan_logits", 256, 512, 2, 4, 2, 64, 300, "BF16", false, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 23);
  eng::ModelWeights w = eng::load_checkpoint(dir.string());
  float* head = eng::writable(w.lm_head);
  for (int i = 0; i < spec.dim; ++i) head[size_t(7) * spec.dim + i] = std::nanf("");
  const std::vector<std::vector<int>> prompt = {{1, 5, 9, 200, 17}};
  eng::GenerationParams greedy;
  greedy.max_new_tokens = 4;
  eng::GenerationParams sampled = greedy;
  sampled.sampling = eng::SamplingParams{0.9f, 20, 0.95f, 7};
  eng::RuntimeOptions o;
  for (const eng::GenerationParams* gp : {&greedy, &sampled}) {  // the host's argmax and top-k reductions
    const auto cpu = eng::create_model(w, o, "cpu");
    const std::string e = error_of([&] { eng::generate(*cpu, prompt, *gp); });
    EXPECT_NE(e.find("logits row 0: logit 7 is NaN: the model produced a non-finite logit"), std::string::npos) << e;
  }
  for (const ScopedEnvVars& env : {ScopedEnvVars{}, ScopedEnvVars{{"FLASHLITE_ENGINE_FUSE_ARGMAX", "0"}}}) {
    ScopedEnv scoped(env);
    CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
    const std::string e = error_of([&] { eng::generate(*m, prompt, greedy); });
    EXPECT_NE(e.find("logits row 0: logit 7 is NaN: the model produced a non-finite logit"), std::string::npos)
        << (env.empty() ? "fused argmax: " : "argmax kernel: ") << e;
  }
  CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
  const std::string e = error_of([&] { eng::generate(*m, prompt, sampled); });
  // The device top-k candidates, named by vocabulary id (not by candidate slot) as the other paths name them.
  EXPECT_NE(e.find("logit 7 is NaN: the model produced a non-finite logit"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

}  // namespace
