// The CUDA engine path against the float64 reference and the CPU engine. Skips where no CUDA device exists (CI);
// run it on the GPU machine. fp32: logits within 1e-3 and greedy tokens identical to the CPU path for 200 steps;
// bf16: logits within bf16 tolerance and the same top-1 on almost every position; batches equal single runs; every
// CudaEngineOptions setting (the paths other models and devices take: cuBLASLt instead of the fused GEMVs, eager
// steps, no PDL, the profiler) generates the default's greedy tokens; a head_dim the fused RoPE epilogue does not
// take runs the GEMVs with the library's append_kv (RoPE + cache append) apart.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <tuple>

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
                                            std::string* why, const eng::CudaEngineOptions& cuda = {}) {
  eng::RuntimeOptions o;
  o.precision = precision;
  o.slots = slots;
  o.cuda = cuda;
  try {
    return eng::create_model(w, o, "cuda");
  } catch (const flashlite::Error& e) {
    *why = e.what();
    return nullptr;
  }
}

#define CUDA_MODEL_OR_SKIP(var, w, precision, slots, ...)                            \
  std::string why_##var;                                                             \
  auto var = cuda_model(w, precision, slots, &why_##var __VA_OPT__(, ) __VA_ARGS__); \
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

// `got` against the reference tokens `want` of the same prompts: equal, or (not exact) parting only where the
// reference model's logits after the common prefix are a near tie (teacher-forced on a model built with `ref`).
void expect_same_tokens(const eng::ModelWeights& w, const eng::CudaEngineOptions& ref,
                        const std::vector<std::vector<int>>& prompts, const std::vector<std::vector<int>>& got,
                        const std::vector<std::vector<int>>& want, bool exact, const std::string& label) {
  for (size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<int>& g = got[b];
    const std::vector<int>& e = want[b];
    ASSERT_EQ(g.size(), e.size());
    size_t t = 0;
    while (t < g.size() && g[t] == e[t]) ++t;
    if (t == g.size()) continue;
    ASSERT_FALSE(exact) << "sequence " << b << " (batch " << prompts.size() << ") parts from the reference at token " << t;
    std::string why;
    auto base = cuda_model(w, "bf16", 1, &why, ref);
    ASSERT_TRUE(base) << why;
    std::vector<int> prefix = prompts[b];
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

// Logits of a model built with `cuda` against float64: prefill 48, then decode one at a time (full logits).
void expect_logits_near_float64(const eng::ModelWeights& w, const eng::CudaEngineOptions& cuda,
                                const std::vector<int>& probe, const std::vector<std::vector<double>>& want,
                                const std::string& label) {
  std::string why;
  auto m = cuda_model(w, "bf16", 1, &why, cuda);
  ASSERT_TRUE(m) << why;
  std::vector<float> got = m->forward({{0, std::vector<int>(probe.begin(), probe.begin() + 48), true}});
  for (size_t t = 48; t < probe.size(); ++t) {
    const auto& row = m->forward({{0, {probe[t]}, true}});
    got.insert(got.end(), row.begin(), row.end());
  }
  const Errors e = compare(got, want);
  std::printf("%sbf16 vs float64: max abs %.4g (logits up to %.3g), top-1 %d/%d\n", label.c_str(), e.max_abs, e.max_ref,
              e.top1_agree, e.rows);
  EXPECT_LT(e.max_abs, 0.05 * e.max_ref);
  EXPECT_GE(e.top1_agree, int(0.9 * e.rows));
}

// Each CudaEngineOptions setting against the defaults on one bf16 model: the same greedy tokens for one sequence and
// a batch of three (decode steps replayed from graphs, several rows through the GEMVs). The settings that keep every
// rounding (graphs off, PDL off, the profiler, verbose) must match exactly; the GEMVs off (cuBLASLt, the separate
// RMSNorm / SwiGLU / residual / argmax kernels, flashlite::append_kv for RoPE + append) sums in another order and may part only where the
// reference's own logits are a near tie. Then logits within the bf16 tolerance of float64, prefill + decode.
TEST(CudaEngine, EngineOptionsGenerateTheDefaultTokens) {
  const synth::Spec spec{"cuda_options", 256, 1024, 2, 4, 2, 64, 3000, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  const reftest::RefModel ref = synth::write_checkpoint(dir, spec, 101);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 200, 17}, {1, 2999}, {1, 7, 7, 7, 8, 9, 10, 11, 12, 13, 14}};
  eng::GenerationParams gp;
  gp.max_new_tokens = 32;
  const eng::CudaEngineOptions defaults;
  std::vector<std::vector<std::vector<int>>> want;  // [batch kind][sequence]
  {
    CUDA_MODEL_OR_SKIP(base, w, "bf16", int(prompts.size()));
    want.push_back(eng::generate(*base, {prompts[0]}, gp).tokens);
    want.push_back(eng::generate(*base, prompts, gp).tokens);
  }
  std::vector<int> probe;
  for (int i = 0; i < 80; ++i) probe.push_back((i * 173 + 11) % spec.vocab);
  const auto probe_want = reftest::forward_all(ref, probe);
  struct V {
    const char* name;
    eng::CudaEngineOptions cuda;
    bool exact;  // the default's tokens exactly, else parting only at a near tie of the default's logits
  };
  const std::vector<V> variants = {
      {"defaults", {}, true},
      {"graphs off", {.graphs = false}, true},
      {"pdl off", {.pdl = false}, true},
      {"profile", {.profile = true}, true},
      {"verbose", {.verbose = true}, true},
      {"gemv off", {.gemv = false}, false},
      {"gemv, graphs and pdl off", {.graphs = false, .gemv = false, .pdl = false}, false},
  };
  for (const V& v : variants) {
    const std::string label = std::string(v.name) + ": ";
    SCOPED_TRACE(label);
    for (int kind = 0; kind < 2; ++kind) {
      const std::vector<std::vector<int>> ps = kind ? prompts : std::vector<std::vector<int>>{prompts[0]};
      CUDA_MODEL_OR_SKIP(m, w, "bf16", int(prompts.size()), v.cuda);
      expect_same_tokens(w, defaults, ps, eng::generate(*m, ps, gp).tokens, want[kind], v.exact, label);
    }
    expect_logits_near_float64(w, v.cuda, probe, probe_want, label);
  }
  std::filesystem::remove_all(dir);
}

// head_dim 20 (not a multiple of 8): the GEMVs run with the QKV GEMV's plain bf16 epilogue and the library's
// append_kv (RoPE + cache append) apart, and attention through flashlite::forward (no batched decode kernel for this head_dim). Logits within
// the bf16 tolerance of float64 with the GEMVs and without (cuBLASLt), and the two generate the same tokens but at a
// near tie.
TEST(CudaEngine, HeadDimOutsideTheFusedRopeUsesTheSeparateRopeKernel) {
  const synth::Spec spec{"cuda_head_dim_20", 256, 512, 2, 4, 2, 20, 3000, "BF16", true, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  const reftest::RefModel ref = synth::write_checkpoint(dir, spec, 29);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  std::vector<int> probe;
  for (int i = 0; i < 80; ++i) probe.push_back((i * 173 + 11) % spec.vocab);
  const auto probe_want = reftest::forward_all(ref, probe);
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 200, 17}, {1, 2999}};
  eng::GenerationParams gp;
  gp.max_new_tokens = 24;
  const eng::CudaEngineOptions defaults, no_gemv{.gemv = false};
  CUDA_MODEL_OR_SKIP(gemv, w, "bf16", int(prompts.size()));
  CUDA_MODEL_OR_SKIP(cublas, w, "bf16", int(prompts.size()), no_gemv);
  expect_same_tokens(w, defaults, prompts, eng::generate(*cublas, prompts, gp).tokens,
                     eng::generate(*gemv, prompts, gp).tokens, false, "head_dim 20, gemv off: ");
  expect_logits_near_float64(w, defaults, probe, probe_want, "head_dim 20: ");
  expect_logits_near_float64(w, no_gemv, probe, probe_want, "head_dim 20, gemv off: ");
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
// sampler's words, with the argmax fused into the LM head (the default) and as its own kernel (the GEMVs off), where
// it used to pick among the finite logits; sampling refuses it through the top-k candidates. The CPU engine says the
// same.
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
  for (const bool fused : {true, false}) {
    CUDA_MODEL_OR_SKIP(m, w, "bf16", 1, eng::CudaEngineOptions{.gemv = fused});
    const std::string e = error_of([&] { eng::generate(*m, prompt, greedy); });
    EXPECT_NE(e.find("logits row 0: logit 7 is NaN: the model produced a non-finite logit"), std::string::npos)
        << (fused ? "fused argmax: " : "argmax kernel: ") << e;
  }
  CUDA_MODEL_OR_SKIP(m, w, "bf16", 1);
  const std::string e = error_of([&] { eng::generate(*m, prompt, sampled); });
  // The device top-k candidates, named by vocabulary id (not by candidate slot) as the other paths name them.
  EXPECT_NE(e.find("logit 7 is NaN: the model produced a non-finite logit"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// A synthetic bf16 checkpoint written for one test (the test removes `dir`), the options of `slots` sequences of
// `context` positions, and the CUDA model on its contiguous cache (null where there is none: `why`).
struct SynthBf16 {
  std::filesystem::path dir;
  reftest::RefModel ref;
  eng::ModelWeights w;
  eng::RuntimeOptions o;
  std::unique_ptr<eng::LlamaModel> flat;
  std::string why;
  SynthBf16(const synth::Spec& spec, uint32_t seed, int slots, int context)
      : dir(synth::fresh_dir(spec.name)), ref(synth::write_checkpoint(dir, spec, seed)),
        w(eng::load_checkpoint(dir.string())) {
    o.precision = "bf16";
    o.slots = slots;
    o.context = context;
    try {
      flat = eng::create_model(w, o, "cuda");
    } catch (const flashlite::Error& e) {
      why = e.what();
    }
  }
};

// The paged cache (the server's): a synthetic bf16 model (head_dim 64) through prefill chunks and decode steps over
// slots in any order, against the contiguous cache (the same kernels but attention: within bf16 noise, the same
// top-1) and against float64; pages taken as sequences grow and given back on reset, a full pool refused by name with
// nothing changed.
TEST(CudaEngine, PagedCacheMatchesContiguousAndFloat64) {
  const synth::Spec spec{"cuda_paged", 256, 512, 2, 4, 2, 64, 300, "BF16", false, true, 0};
  SynthBf16 m(spec, 78, 4, 128);
  const auto& [dir, ref, w, flat] = std::tie(m.dir, m.ref, m.w, m.flat);
  eng::RuntimeOptions& o = m.o;
  if (!flat) GTEST_SKIP() << "no CUDA engine here: " << m.why;
  o.kv_page_size = 16;
  o.kv_pages = 18;  // 288 positions for 4 x 128: the pool, not the slots, runs out first
  const auto paged = eng::create_model(w, o, "cuda");
  EXPECT_EQ(paged->kv_usage().pages_total, 18);
  // Three sequences: prompts of 40, 17 and 5 tokens in one call (slots 3, 0, 2: out of order), then 30 decode steps
  // over those slots in another order, every row's logits kept.
  std::vector<std::vector<int>> seq(4);
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 80; ++i) seq[s].push_back((i * 37 + s * 11 + 3) % spec.vocab);
  auto run = [&](eng::LlamaModel& m) {
    std::vector<float> all;
    auto add = [&](const std::vector<float>& l) { all.insert(all.end(), l.begin(), l.end()); };
    add(m.forward({{3, {seq[3].begin(), seq[3].begin() + 40}, true},
                   {0, {seq[0].begin(), seq[0].begin() + 17}, true},
                   {2, {seq[2].begin(), seq[2].begin() + 5}, true}}));
    for (int t = 0; t < 30; ++t) add(m.forward({{2, {seq[2][5 + t]}, true}, {3, {seq[3][40 + t]}, true}, {0, {seq[0][17 + t]}, true}}));
    return all;
  };
  const std::vector<float> a = run(*flat), b = run(*paged);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  int top1 = 0, rows = int(a.size() / spec.vocab);
  for (int r = 0; r < rows; ++r) {
    int ia = 0, ib = 0;
    for (int v = 0; v < spec.vocab; ++v) {
      const size_t i = size_t(r) * spec.vocab + v;
      diff = std::max(diff, std::isfinite(b[i]) ? std::abs(double(a[i]) - b[i]) : INFINITY);
      scale = std::max(scale, std::abs(double(a[i])));
      if (a[i] > a[size_t(r) * spec.vocab + ia]) ia = v;
      if (b[i] > b[size_t(r) * spec.vocab + ib]) ib = v;
    }
    top1 += ia == ib;
  }
  EXPECT_LT(diff, 0.02 * scale) << diff;
  EXPECT_GE(top1, rows - 2);
  // Slot 3 against float64: its 70 positions.
  const auto want = reftest::forward_all(ref, {seq[3].begin(), seq[3].begin() + 70});
  std::vector<float> got3(b.begin(), b.begin() + size_t(40) * spec.vocab);
  for (int t = 0; t < 30; ++t) {
    const size_t row = size_t(40 + 17 + 5 + 3 * t + 1);  // the decode step's second row is slot 3
    got3.insert(got3.end(), b.begin() + row * spec.vocab, b.begin() + (row + 1) * spec.vocab);
  }
  const Errors e = compare(got3, want);
  EXPECT_LT(e.max_abs, 0.05 * e.max_ref);
  // Pages: 47 + 35 + 70 tokens hold 3 + 3 + 5; an 8-page prompt does not fit the 7 left of 18.
  EXPECT_EQ(paged->kv_usage().pages_used, 11);
  const std::vector<int> long_prompt(150, 7);
  EXPECT_THROW(paged->forward({{1, {long_prompt.begin(), long_prompt.begin() + 128}}}), flashlite::Error);
  EXPECT_EQ(paged->length(1), 0);
  EXPECT_EQ(paged->kv_usage().pages_used, 11);
  paged->reset(3);
  EXPECT_EQ(paged->kv_usage().pages_used, 6);
  EXPECT_NO_THROW(paged->forward({{1, {long_prompt.begin(), long_prompt.begin() + 100}}}));  // 7 pages now fit
  EXPECT_EQ(paged->kv_usage().pages_used, 13);
  std::filesystem::remove_all(dir);
}

// Mixed steps on the paged cache: short prompt chunks beside decode rows run as row steps (one decode row per new
// token, padded to a bucket, replayed from CUDA graphs once a bucket recurs), long chunks through prefill. A schedule
// of joins, continued chunks, a reset slot that joins again, GEMV-sized and pure decode steps, every row's logits kept:
// against the contiguous cache (its own kernels: within bf16 noise, the same top-1), against float64 for two slots,
// the same schedule with graphs off (the same kernels launched one by one: bitwise equal), and greedy ids selected on
// the device equal to the contiguous cache's. Pages all back after the resets (the pad rows' spare pages lie outside
// the book's pool).
TEST(CudaEngine, MixedStepsRunAsRowStepsOnThePagedCache) {
  const synth::Spec spec{"cuda_rows", 256, 512, 2, 4, 2, 64, 300, "BF16", false, true, 0, {}, 256};
  SynthBf16 m(spec, 91, 6, 200);
  const auto& [dir, ref, w, flat] = std::tie(m.dir, m.ref, m.w, m.flat);
  eng::RuntimeOptions& o = m.o;
  if (!flat) GTEST_SKIP() << "no CUDA engine here: " << m.why;
  o.kv_page_size = 16;
  const auto paged = eng::create_model(w, o, "cuda");
  o.cuda.graphs = false;
  const auto eager = eng::create_model(w, o, "cuda");
  o.cuda.graphs = true;
  const auto paged_ids = eng::create_model(w, o, "cuda");
  o.kv_page_size = 0;
  const auto flat_ids = eng::create_model(w, o, "cuda");

  std::vector<std::vector<int>> seq(6);
  for (int s = 0; s < 6; ++s)
    for (int i = 0; i < 200; ++i) seq[s].push_back((i * 53 + s * 29 + 7) % spec.vocab);
  // (slot, new tokens) per step; -1 resets the slot (its sequence starts again from seq[slot][0]).
  using Plan = std::vector<std::pair<int, int>>;
  const std::vector<Plan> schedule = {
      {{4, 20}, {1, 9}},                                // prompts alone: 29 rows -> 32
      {{1, 1}, {4, 1}, {0, 12}},                        // 14 -> 32
      {{0, 1}, {1, 1}, {4, 1}, {2, 10}},                // 13 -> 32: the bucket's graph is captured here
      {{0, 1}, {1, 1}, {4, 1}, {2, 6}},                 // a continued chunk, replayed
      {{0, 1}, {1, 1}, {4, 1}, {2, 1}, {3, 7}},         // replayed
      {{0, 1}, {1, 1}, {4, 1}, {2, 1}, {3, 1}, {5, 3}},  // 8 rows: the fused GEMVs, unpadded
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}},  // a pure decode step
      {{0, 1}, {1, 1}, {2, 1}, {5, 40}},                // 43 -> 64
      {{0, 1}, {3, 130}},                               // a chunk past 128 tokens: prefill
      {{1, -1}},
      {{0, 1}, {2, 1}, {4, 1}, {1, 12}},                // slot 1 joins again on freed pages: 15 -> 32
      {{0, 1}, {1, 1}, {2, 1}, {4, 1}, {5, 9}},         // 13 -> 32 (after prefill grew the scratch: captured again)
      {{0, 1}, {1, 1}, {2, 1}, {4, 1}, {5, 9}},
      {{0, 1}, {1, 1}, {2, 1}, {4, 1}, {5, 9}},
  };
  // Runs the schedule; every row's logits in step order, and each slot's rows of its current sequence.
  struct Run {
    std::vector<float> all;
    std::vector<std::vector<float>> by_slot = std::vector<std::vector<float>>(6);
    std::vector<int> ids;
  };
  auto run = [&](eng::LlamaModel& m, bool argmax) {
    Run r;
    std::vector<int> fed(6, 0);
    eng::LogitsRequest req;
    req.kind = eng::LogitsRequest::Kind::argmax;
    for (const Plan& step : schedule) {
      std::vector<eng::SequenceInput> in;
      for (auto [slot, n] : step) {
        if (n < 0) {
          m.reset(slot);
          fed[slot] = 0;
          r.by_slot[slot].clear();
          continue;
        }
        in.push_back({slot, {seq[slot].begin() + fed[slot], seq[slot].begin() + fed[slot] + n}, !argmax});
        fed[slot] += n;
      }
      if (in.empty()) continue;
      if (argmax) {
        const eng::LogitsOutput out = m.forward_select(in, req);
        r.ids.insert(r.ids.end(), out.ids, out.ids + out.rows);
        continue;
      }
      const std::vector<float>& l = m.forward(in);
      r.all.insert(r.all.end(), l.begin(), l.end());
      size_t row = 0;
      for (const eng::SequenceInput& x : in) {
        for (size_t t = 0; t < x.tokens.size(); ++t, ++row)
          r.by_slot[x.slot].insert(r.by_slot[x.slot].end(), l.begin() + row * spec.vocab,
                                   l.begin() + (row + 1) * spec.vocab);
      }
    }
    return r;
  };
  const Run a = run(*flat, false), b = run(*paged, false), c = run(*eager, false);
  // 13 forward calls: 11 row steps (one of 8 rows on the GEMVs), a pure decode step, a prefill; the (32 rows, 16 logit
  // rows) bucket is captured on its second step and again after the prefill grew the scratch: 7 replays.
  EXPECT_EQ(paged->step_stats().steps, 13);
  EXPECT_EQ(paged->step_stats().row_steps, 11);
  EXPECT_EQ(paged->step_stats().replayed, 7);
  EXPECT_EQ(eager->step_stats().row_steps, 11);
  EXPECT_EQ(eager->step_stats().replayed, 0);
  EXPECT_EQ(flat->step_stats().row_steps, 0) << "the contiguous cache has no row steps";
  ASSERT_EQ(a.all.size(), b.all.size());
  ASSERT_EQ(b.all.size(), c.all.size());
  EXPECT_TRUE(b.all == c.all) << "graph-replayed row steps differ from the same steps launched one by one";
  double diff = 0, scale = 0;
  int top1 = 0;
  const int rows = int(a.all.size() / spec.vocab);
  std::vector<int> flat_top1(rows);
  for (int r = 0; r < rows; ++r) {
    int ia = 0, ib = 0;
    for (int v = 0; v < spec.vocab; ++v) {
      const size_t i = size_t(r) * spec.vocab + v;
      diff = std::max(diff, std::isfinite(b.all[i]) ? std::abs(double(a.all[i]) - b.all[i]) : INFINITY);
      scale = std::max(scale, std::abs(double(a.all[i])));
      if (a.all[i] > a.all[size_t(r) * spec.vocab + ia]) ia = v;
      if (b.all[i] > b.all[size_t(r) * spec.vocab + ib]) ib = v;
    }
    flat_top1[r] = ia;
    top1 += ia == ib;
  }
  EXPECT_LT(diff, 0.02 * scale) << diff;
  EXPECT_GE(top1, rows - 3) << "of " << rows;
  for (int slot : {4, 5}) {  // never reset: every position of their sequences
    const size_t n = b.by_slot[slot].size() / spec.vocab;
    const auto want = reftest::forward_all(ref, {seq[slot].begin(), seq[slot].begin() + n});
    const Errors e = compare(b.by_slot[slot], want);
    EXPECT_LT(e.max_abs, 0.05 * e.max_ref) << "slot " << slot;
    EXPECT_GE(e.top1_agree, e.rows - 2) << "slot " << slot;
  }
  // Greedy ids on the device (the last row of each input): against the contiguous cache's ids.
  const Run ia = run(*flat_ids, true), ib = run(*paged_ids, true);
  ASSERT_EQ(ia.ids.size(), ib.ids.size());
  int same = 0;
  for (size_t i = 0; i < ia.ids.size(); ++i) same += ia.ids[i] == ib.ids[i];
  EXPECT_GE(same, int(ia.ids.size()) - 2) << "of " << ia.ids.size();
  for (int slot = 0; slot < 6; ++slot) paged->reset(slot);
  EXPECT_EQ(paged->kv_usage().pages_used, 0);
  EXPECT_EQ(paged->kv_usage().pages_total, 6 * 13);
  std::filesystem::remove_all(dir);
}

// fp32, and a head_dim the decode kernels lack (stories260K's 8), have no paged decode / prefill kernel on CUDA:
// refused by name, as PagedCacheUnsupported (the server then takes the contiguous cache).
TEST(CudaEngine, PagedCacheNeedsTheTensorCoreKernels) {
  const std::string path = reftest::models_dir() + "/stories260K/stories260K.bin";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model absent: " << path;
  const eng::ModelWeights w = eng::load_checkpoint(path);
  std::string why;
  if (!cuda_model(w, "fp32", 1, &why)) GTEST_SKIP() << "no CUDA engine here: " << why;
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    eng::RuntimeOptions o;
    o.precision = precision;
    o.kv_page_size = 16;
    try {
      eng::create_model(w, o, "cuda");
      FAIL() << "a paged CUDA model of head_dim " << w.config.head_dim << " was made";
    } catch (const eng::PagedCacheUnsupported& e) {
      EXPECT_NE(std::string(e.what()).find("a paged KV cache on CUDA needs"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
