// Tensor parallelism (engine/parallel/): the split itself (TensorShard), a rank's blocks read straight from a
// Hugging Face checkpoint against the same blocks cut from the whole model, and the sharded model against the whole
// one: N ranks as threads of this process, the all-reduce an in-process sum, teacher-forced fp32 logits within 1e-5
// on stories260K and random checkpoints (GQA, tied and untied, uneven FFN and vocabulary splits, contiguous and
// paged caches, prefill and decode rows in one call). Also what failures do: a rank that throws ends every rank with
// its own message and nothing waits. On a machine with two GPUs, the same comparison through NCCL in bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/llama_cpu.h"
#include "engine/model.h"
#include "engine/parallel/local_group.h"
#include "engine/parallel/parallel_model.h"
#include "engine/parallel/rank_threads.h"
#include "engine/sampler.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "flashlite/version.h"
#include "models_required.h"
#include "reference_llama.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;
using flashlite::DType;

std::string stories() { return reftest::models_dir() + "/stories260K/stories260K.bin"; }

// One call of each kind over three slots: a 13-token prefill with every row's logits, a 1-token and a 9-token
// prompt, then decode steps of all three; every logits row, in order.
std::vector<float> scenario(eng::LlamaModel& m, uint32_t seed) {
  std::mt19937 rng(seed);
  const int vocab = m.config().vocab_size;
  auto tokens = [&](int n) {
    std::vector<int> t(n);
    for (int& x : t) x = int(rng() % uint32_t(vocab));
    return t;
  };
  std::vector<float> all;
  auto run = [&](const std::vector<eng::SequenceInput>& in) {
    const std::vector<float>& l = m.forward(in);
    all.insert(all.end(), l.begin(), l.end());
  };
  run({{0, tokens(13), true}, {1, tokens(1), false}, {2, tokens(9), false}});
  for (int step = 0; step < 5; ++step) run({{0, tokens(1)}, {1, tokens(1)}, {2, tokens(1)}});
  run({{1, tokens(11), true}});  // a chunk appended to a cached prefix
  return all;
}

// Largest |a - b| relative to the reference's largest magnitude (fp32 logits; summation order is all that differs).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return diff / scale;
}

// The message of the flashlite::Error that f() throws, or "no error".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const flashlite::Error& e) {
    return e.what();
  }
  return "no error";
}

eng::RuntimeOptions options(int tp, int page_size = 0) {
  eng::RuntimeOptions o;
  o.slots = 3;
  o.context = 64;
  o.threads = 1;
  o.tp = tp;
  o.kv_page_size = page_size;
  return o;
}

TEST(TensorShard, RangesCoverTheModelOnce) {
  eng::ModelConfig c;
  c.n_heads = 32, c.n_kv_heads = 8, c.hidden_dim = 14337, c.vocab_size = 128257, c.head_dim = 128, c.dim = 4096;
  for (int ranks : {1, 2, 4, 8}) {
    int heads = 0, kv = 0, hidden = 0, vocab = 0;
    for (int r = 0; r < ranks; ++r) {
      const eng::TensorShard s = eng::TensorShard::of(c, r, ranks);
      EXPECT_EQ(s.head0, heads);  // contiguous, in rank order
      EXPECT_EQ(s.kv_head0, kv);
      EXPECT_EQ(s.hidden0, hidden);
      EXPECT_EQ(s.vocab0, vocab);
      EXPECT_EQ(s.heads * c.n_kv_heads, s.kv_heads * c.n_heads);  // each rank's query heads read its own KV heads
      EXPECT_LE(std::abs(s.hidden - c.hidden_dim / ranks), 1);
      heads += s.heads, kv += s.kv_heads, hidden += s.hidden, vocab += s.vocab;
    }
    EXPECT_EQ(heads, c.n_heads);
    EXPECT_EQ(kv, c.n_kv_heads);
    EXPECT_EQ(hidden, c.hidden_dim);
    EXPECT_EQ(vocab, c.vocab_size);
  }
  auto error = [&](int rank, int ranks) {
    try {
      eng::TensorShard::of(c, rank, ranks);
    } catch (const flashlite::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(0, 3).find("KV heads to divide among them; the model has 8"), std::string::npos) << error(0, 3);
  EXPECT_NE(error(0, 16).find("KV heads"), std::string::npos);
  EXPECT_NE(error(2, 2).find("rank 2 of 2 does not exist"), std::string::npos) << error(2, 2);
  EXPECT_NE(error(0, 0).find("does not exist"), std::string::npos);
  c.hidden_dim = 3;
  EXPECT_NE(error(0, 4).find("intermediate_size (3) is smaller"), std::string::npos) << error(0, 4);
}

// A rank's weights read from the checkpoint's blocks equal the blocks cut from the whole model, bit for bit, for
// every tensor (the split's definition is one list: tensor_slots).
TEST(TensorParallelLoad, RankBlocksFromTheFileEqualTheSlicedWholeModel) {
  for (bool tied : {false, true}) {
    const synth::Spec spec{tied ? "tp_load_tied" : "tp_load", 48, 90, 2, 8, 4, 6, 203, "BF16", tied, true, tied ? 0 : 2};
    const auto dir = synth::fresh_dir(spec.name);
    synth::write_checkpoint(dir, spec, 7);
    const eng::ModelWeights whole = eng::load_checkpoint(dir.string());
    for (int ranks : {2, 4}) {
      for (int r = 0; r < ranks; ++r) {
        const eng::ModelWeights read = eng::load_checkpoint(dir.string(), {}, r, ranks);
        const eng::ModelWeights cut = eng::slice_weights(whole, r, ranks);
        ASSERT_EQ(read.arena.size, cut.arena.size);
        EXPECT_EQ(read.shard.vocab, cut.shard.vocab);
        EXPECT_TRUE(std::equal(read.arena.data.get(), read.arena.data.get() + read.arena.size, cut.arena.data.get()))
            << spec.name << " rank " << r << " of " << ranks;
        // The LM head's rows are the rank's vocabulary rows of the whole model's head.
        const eng::ModelConfig rc = read.rank_config();
        EXPECT_EQ(rc.vocab_size, read.shard.vocab);
        EXPECT_TRUE(std::equal(read.lm_head, read.lm_head + size_t(rc.vocab_size) * rc.dim,
                               whole.lm_head + size_t(read.shard.vocab0) * rc.dim));
      }
    }
  }
}

// What the CLI reads under --tp instead of the weights: the config exactly as the loader sets it, also where a
// checkpoint omits lm_head without saying tie_word_embeddings (the loader ties it).
TEST(TensorParallelLoad, ConfigAloneEqualsTheLoadersConfig) {
  std::vector<std::string> paths;
  for (bool tied : {false, true}) {
    const synth::Spec spec{tied ? "tp_cfg_tied" : "tp_cfg", 48, 90, 2, 8, 4, 6, 203, "BF16", tied, true, 0};
    const auto dir = synth::fresh_dir(spec.name);
    synth::write_checkpoint(dir, spec, 5);
    paths.push_back(dir.string());
  }
  {  // tied by omission: config.json says untied, the file has no lm_head
    const synth::Spec spec{"tp_cfg_omitted", 48, 90, 2, 8, 4, 6, 203, "BF16", true, true, 0};
    const auto dir = synth::fresh_dir(spec.name);
    synth::write_checkpoint(dir, spec, 6);
    nlohmann::json cfg = synth::config_json(spec);
    cfg["tie_word_embeddings"] = false;
    synth::write_file(dir / "config.json", cfg.dump());
    paths.push_back(dir.string());
  }
  if (std::filesystem::exists(stories())) paths.push_back(stories());
  for (const std::string& p : paths) {
    const eng::ModelConfig a = eng::load_checkpoint_config(p), b = eng::load_checkpoint(p).config;
    EXPECT_EQ(a.summary(), b.summary()) << p;
    EXPECT_EQ(a.tie_embeddings, b.tie_embeddings) << p;
    EXPECT_EQ(a.eos_ids, b.eos_ids) << p;
    EXPECT_EQ(a.bos_id, b.bos_id) << p;
  }
  EXPECT_TRUE(eng::load_checkpoint_config(paths[2]).tie_embeddings);
}

// A block read from a tensor is those rows and columns of the whole tensor read; a block outside it is refused.
TEST(TensorParallelLoad, BlocksOfATensor) {
  const synth::Spec spec{"tp_block", 48, 90, 1, 8, 4, 6, 203, "F16", false, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 8);
  const eng::SafetensorsCheckpoint ckpt(dir.string());
  const eng::StTensor& t = ckpt.get("model.layers.0.mlp.down_proj.weight");  // [48, 90]
  std::vector<float> whole(t.numel), block(size_t(7) * 11);
  eng::read_f32(t, whole.data());
  eng::read_f32_block(t, 40, 7, 79, 11, block.data());
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 11; ++c) ASSERT_EQ(block[size_t(r) * 11 + c], whole[size_t(40 + r) * 90 + 79 + c]) << r << " " << c;
  EXPECT_THROW(eng::read_f32_block(t, 42, 7, 0, 1, block.data()), flashlite::Error);
  EXPECT_THROW(eng::read_f32_block(t, 0, 1, 80, 11, block.data()), flashlite::Error);
  EXPECT_THROW(eng::read_f32_block(t, -1, 1, 0, 1, block.data()), flashlite::Error);
}

// stories260K (llama2.c, tied, 8 / 4 heads, head_dim 8, FFN 172): TP 2 and 4 against the whole model.
TEST(TensorParallelCpu, Stories260KLogitsEqualTheWholeModel) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights w = eng::load_checkpoint(stories());
  for (int page : {0, 16}) {
    const auto whole = eng::create_model(w, options(1, page), "cpu");
    const std::vector<float> ref = scenario(*whole, 3);
    for (int tp : {2, 4}) {
      const auto split = eng::create_model(w, options(tp, page), "cpu");
      EXPECT_EQ(split->config().vocab_size, 512);
      const std::vector<float> got = scenario(*split, 3);
      EXPECT_LE(max_rel_diff(got, ref), 1e-5) << "tp " << tp << " page size " << page;
      for (int s = 0; s < 3; ++s) EXPECT_EQ(split->length(s), whole->length(s));
      EXPECT_EQ(split->kv_usage().pages_used, whole->kv_usage().pages_used);
    }
  }
}

// Random Hugging Face checkpoints, each rank loading only its blocks (ParallelModel's loader), uneven FFN and
// vocabulary splits, against the whole model (which the hf_checkpoint tests hold to the float64 forward).
TEST(TensorParallelCpu, RandomCheckpointsLogitsEqualTheWholeModel) {
  for (bool tied : {false, true}) {
    const synth::Spec spec{tied ? "tp_model_tied" : "tp_model", 64, 90, 2, 8, 4, 8, 203, "F32", tied, true, 0};
    const auto dir = synth::fresh_dir(spec.name);
    synth::write_checkpoint(dir, spec, 11);
    const eng::ModelWeights w = eng::load_checkpoint(dir.string());
    const auto whole = eng::create_model(w, options(1), "cpu");
    const std::vector<float> ref = scenario(*whole, 5);
    for (int tp : {2, 4}) {
      eng::ParallelModel split(
          tp, [&](int r, int n) { return eng::load_checkpoint(dir.string(), {}, r, n); }, options(tp), "cpu");
      EXPECT_LE(max_rel_diff(scenario(split, 5), ref), 1e-5) << spec.name << " tp " << tp;
      EXPECT_EQ(split.ranks(), tp);
    }
  }
}

// Greedy decoding through forward_select (argmax over the gathered logits): the same tokens, or a tie-aware
// difference (the two candidates within 1e-5 of each other in the whole model) after which the runs may part.
TEST(TensorParallelCpu, GreedyTokensMatchTieAware) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights w = eng::load_checkpoint(stories());
  const auto whole = eng::create_model(w, options(1), "cpu");
  const auto split = eng::create_model(w, options(2), "cpu");
  int a = 1, b = 1;
  const eng::LogitsRequest greedy{eng::LogitsRequest::Kind::argmax, 0};
  for (int step = 0; step < 60; ++step) {
    const std::vector<float> row = whole->forward({{0, {a}}});
    const int next_a = eng::argmax(row.data(), int(row.size()));
    const int next_b = split->forward_select({{0, {b}}}, greedy).ids[0];
    if (next_a != next_b) {
      EXPECT_LE(std::abs(row[next_a] - row[next_b]), 1e-5 * std::max(1.0f, std::abs(row[next_a]))) << "step " << step;
      break;
    }
    a = b = next_a;
  }
}

// Greedy and top-k selected per rank and merged (only candidates come back): the one model's picks, values and tie
// rule; a k above a rank's columns takes the whole rows.
TEST(TensorParallelCpu, SelectionMergedAcrossRanksEqualsTheWholeModel) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights w = eng::load_checkpoint(stories());
  for (int tp : {2, 4}) {
    const auto whole = eng::create_model(w, options(1), "cpu");
    const auto split = eng::create_model(w, options(tp), "cpu");
    std::mt19937 rng(tp);
    for (const eng::LogitsRequest req : {eng::LogitsRequest{eng::LogitsRequest::Kind::argmax, 0},
                                         eng::LogitsRequest{eng::LogitsRequest::Kind::top_k, 1},
                                         eng::LogitsRequest{eng::LogitsRequest::Kind::top_k, 7},
                                         eng::LogitsRequest{eng::LogitsRequest::Kind::top_k, 300}}) {
      std::vector<eng::SequenceInput> in;
      for (int s = 0; s < 3; ++s) in.push_back({s, {int(rng() % 512), int(rng() % 512)}, s == 1});
      const eng::LogitsOutput a = whole->forward_select(in, req);
      const std::vector<int32_t> a_ids(a.ids, a.ids + a.rows * std::max(1, a.k));
      const std::vector<float> a_values = a.values ? std::vector<float>(a.values, a.values + a.rows * a.k) : std::vector<float>{};
      const eng::LogitsOutput b = split->forward_select(in, req);
      ASSERT_EQ(b.rows, a.rows);
      ASSERT_EQ(b.k, a.k);
      EXPECT_EQ(b.kind, a.kind);
      for (int r = 0; r < a.rows; ++r) {
        // top-k is a set: compare sorted by (value, id) as the sampler reads it
        std::vector<std::pair<float, int>> x, y;
        for (int j = 0; j < std::max(1, a.k); ++j) {
          x.push_back({a.values ? a_values[r * a.k + j] : 0.f, a_ids[r * std::max(1, a.k) + j]});
          y.push_back({b.values ? b.values[r * b.k + j] : 0.f, b.ids[r * std::max(1, b.k) + j]});
        }
        std::sort(x.begin(), x.end(), eng::Sampler::before);
        std::sort(y.begin(), y.end(), eng::Sampler::before);
        for (size_t j = 0; j < x.size(); ++j) {
          EXPECT_EQ(y[j].second, x[j].second) << "tp " << tp << " k " << req.k << " row " << r << " rank " << j;
          EXPECT_NEAR(y[j].first, x[j].first, 1e-5 * std::max(1.0f, std::abs(x[j].first)));
        }
      }
    }
  }
}

// A row that cannot be sampled (a NaN logit in some rank's slice) is refused by the split model as by the whole one,
// with the same message (the lowest NaN id over the whole row), for greedy and top-k selection.
TEST(TensorParallelCpu, UnsampleableRowsAreRefusedAsByTheWholeModel) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  eng::ModelWeights w = eng::load_checkpoint(stories());
  const int dim = w.config.dim;
  // NaN LM-head rows (tied: the embedding rows of tokens the inputs never use): ids in the last rank's slice, and
  // then also one in the first rank's, which must win as the lowest.
  for (const std::vector<int>& poisoned : {std::vector<int>{400}, std::vector<int>{400, 100}}) {
    for (int id : poisoned) const_cast<float*>(w.lm_head)[size_t(id) * dim] = NAN;
    const auto whole = eng::create_model(w, options(1), "cpu");
    for (int tp : {2, 4}) {
      const auto split = eng::create_model(w, options(tp), "cpu");
      for (const eng::LogitsRequest req : {eng::LogitsRequest{eng::LogitsRequest::Kind::argmax, 0},
                                           eng::LogitsRequest{eng::LogitsRequest::Kind::top_k, 5}}) {
        const std::vector<eng::SequenceInput> in{{0, {1, 2, 3}, false}, {1, {4}, false}};
        const std::string a = error_of([&] { whole->forward_select(in, req); });
        const std::string b = error_of([&] { split->forward_select(in, req); });
        const std::string lowest = "logit " + std::to_string(poisoned.back()) + " is NaN";
        EXPECT_NE(a.find(lowest), std::string::npos) << a;
        EXPECT_EQ(b, a) << "tp " << tp << " k " << req.k;
        whole->reset(0), whole->reset(1), split->reset(0), split->reset(1);
      }
    }
  }
}

// Bad input fails on every rank alike, with the message of one model, and changes nothing; the model then runs on.
TEST(TensorParallelCpu, BadInputLeavesEveryRankAsItWas) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights w = eng::load_checkpoint(stories());
  const auto whole = eng::create_model(w, options(1), "cpu");
  const auto split = eng::create_model(w, options(2), "cpu");
  for (auto* m : {whole.get(), split.get()}) m->forward({{0, {1, 2, 3}}});
  auto error = [](eng::LlamaModel& m, const std::vector<eng::SequenceInput>& in) { return error_of([&] { m.forward(in); }); };
  for (const auto& bad : std::vector<std::vector<eng::SequenceInput>>{
           {{0, {512}}}, {{0, {-1}}}, {{3, {1}}}, {{0, {1}}, {0, {2}}}, {{0, std::vector<int>(62, 1)}}}) {
    const std::string e = error(*split, bad);
    EXPECT_EQ(e, error(*whole, bad));
    EXPECT_EQ(split->length(0), 3) << e;
  }
  const std::vector<float> a = whole->forward({{0, {4}}}), b = split->forward({{0, {4}}});
  EXPECT_LE(max_rel_diff(b, a), 1e-5);
}

TEST(TensorParallelCpu, WeightsOfAnotherSplitAreRefused) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights part = eng::slice_weights(eng::load_checkpoint(stories()), 1, 2);
  try {
    eng::LlamaCpu m(part, options(1));
    FAIL() << "a rank's weights ran as a whole model";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2 but the model has 1 rank(s)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(eng::slice_weights(part, 0, 2), flashlite::Error);  // only a whole model is sliced
}

// A rank that fails (here: its loader) ends the whole model with that rank's own error, not the "another rank
// failed" that the others see, and nothing waits for the failed rank.
TEST(TensorParallelCpu, ARankThatFailsEndsEveryRankWithItsMessage) {
  if (!std::filesystem::exists(stories())) {
    FLASHLITE_MODEL_ABSENT("stories260K is not in " << reftest::models_dir());
  }
  const eng::ModelWeights w = eng::load_checkpoint(stories());
  try {
    eng::ParallelModel m(
        4,
        [&](int r, int n) {
          if (r == 2) throw flashlite::Error(flashlite::ErrorKind::runtime, "rank 2 could not read its shard");
          return eng::slice_weights(w, r, n);
        },
        options(4), "cpu");
    FAIL() << "a failed rank went unnoticed";
  } catch (const flashlite::Error& e) {
    EXPECT_STREQ(e.what(), "rank 2 could not read its shard");
  }
}

// The rank threads, blocking (CPU ranks) and spinning (GPU ranks): every job runs exactly once on every rank, in
// order, back to back and after pauses longer than the spins (so that the blocked path is taken too); a rank's error
// comes back as its own; a deadline fires on a rank that overruns it and run() still returns once it finishes.
TEST(RankThreads, EveryJobRunsOnceOnEveryRankSpinningOrNot) {
  for (bool spin : {false, true}) {
    const int ranks = 3;
    eng::RankThreads threads(ranks, spin);
    std::vector<std::atomic<int>> runs(ranks);
    std::vector<int> last(ranks, -1);
    for (int job = 0; job < 600; ++job) {
      if (job % 200 == 199) std::this_thread::sleep_for(std::chrono::milliseconds(30));  // past both spins
      const auto errors = threads.run([&](int r) {
        ASSERT_EQ(last[r], job - 1) << "rank " << r;  // in order, none skipped
        last[r] = job;
        ++runs[r];
        if (job == 300 && r == 1) throw flashlite::Error(flashlite::ErrorKind::runtime, "rank 1 job 300");
      });
      for (int r = 0; r < ranks; ++r) {
        if (job == 300 && r == 1) {
          EXPECT_THROW(std::rethrow_exception(errors[r]), flashlite::Error);
        } else {
          EXPECT_FALSE(errors[r]) << spin << " job " << job << " rank " << r;
        }
      }
    }
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(runs[r].load(), 600) << spin;
    bool fired = false;
    const auto errors = threads.run(
        [&](int r) {
          if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(60));
        },
        {}, std::chrono::milliseconds(10), [&] { fired = true; });
    EXPECT_TRUE(fired) << spin;
    EXPECT_TRUE(threads.timed_out()) << spin;
    for (const auto& e : errors) EXPECT_FALSE(e);
  }
}

// The in-process all-reduce: the sum in rank order on every rank (bitwise the same everywhere); a rank that fails
// before its collective releases the others with CollectiveAborted; after recover() the group works again.
TEST(LocalGroup, SumsInRankOrderAndAbortsWithoutWaiting) {
  const int ranks = 3;
  const size_t n = 1001;
  eng::LocalGroup group(ranks);
  eng::RankThreads threads(ranks);
  std::vector<std::vector<float>> data(ranks, std::vector<float>(n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (auto& d : data)
    for (float& x : d) x = u(rng);
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; ++i) expect[i] = (data[0][i] + data[1][i]) + data[2][i];
  auto errors = threads.run([&](int r) { group.member(r).all_reduce_sum(data[r].data(), n, DType::f32, nullptr); });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_FALSE(errors[r]);
    EXPECT_EQ(data[r], expect) << "rank " << r;
  }
  // Rank 1 fails before its collective; ranks 0 and 2 are released.
  errors = threads.run(
      [&](int r) {
        if (r == 1) throw flashlite::Error(flashlite::ErrorKind::runtime, "rank 1 failed");
        group.member(r).all_reduce_sum(data[r].data(), n, DType::f32, nullptr);
      },
      [&](int) { group.abort(); });
  for (int r : {0, 2}) EXPECT_THROW(std::rethrow_exception(errors[r]), eng::CollectiveAborted);
  EXPECT_THROW(std::rethrow_exception(errors[1]), flashlite::Error);
  EXPECT_EQ(data[0], expect);  // untouched
  ASSERT_TRUE(group.recover());
  errors = threads.run([&](int r) { group.member(r).all_reduce_sum(data[r].data(), n, DType::f32, nullptr); });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_FALSE(errors[r]);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(data[r][i], 3 * expect[i] - (3 * expect[i] - data[0][i])) << i;
  }
  EXPECT_THROW(group.member(0).all_reduce_sum(data[0].data(), n, DType::bf16, nullptr), flashlite::Error);
}

// A rank that never reaches its collective (a hung device, say): the deadline aborts the group, the waiting ranks
// are released, the late rank fails at its collective, and nothing waits forever.
TEST(LocalGroup, ADeadlineReleasesRanksWaitingForOneThatNeverCame) {
  const int ranks = 3;
  eng::LocalGroup group(ranks);
  eng::RankThreads threads(ranks);
  std::vector<std::vector<float>> data(ranks, std::vector<float>(64, 1.f));
  std::atomic<bool> released{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = threads.run(
      [&](int r) {
        if (r == 1) {  // late: arrives only after the others were released
          while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        group.member(r).all_reduce_sum(data[r].data(), 64, DType::f32, nullptr);
      },
      [&](int) { released = true; }, std::chrono::milliseconds(100), [&] { group.abort(); });
  EXPECT_TRUE(threads.timed_out());
  for (int r = 0; r < ranks; ++r) EXPECT_THROW(std::rethrow_exception(errors[r]), eng::CollectiveAborted) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(group.recover());
  const auto again = threads.run([&](int r) { group.member(r).all_reduce_sum(data[r].data(), 64, DType::f32, nullptr); },
                                 {}, std::chrono::milliseconds(5000), [&] { group.abort(); });
  EXPECT_FALSE(threads.timed_out());
  for (int r = 0; r < ranks; ++r) {
    EXPECT_FALSE(again[r]);
    EXPECT_EQ(data[r][0], 3.f);
  }
}

// Two GPUs (the GPU machine with 2 H100s; 4 where there are four): TP 2 (and 4) through NCCL against TP 1, bf16
// (CUDA graphs and GEMVs in decode steps, cuBLASLt in prefill) and fp32.
TEST(TensorParallelCuda, TwoGpusLogitsEqualOneGpu) {
  if (flashlite::cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const synth::Spec spec{"tp_cuda", 256, 704, 2, 8, 4, 64, 1000, "BF16", false, true, 0};
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, 13);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  for (const char* precision : {"fp32", "bf16"}) {
    eng::RuntimeOptions o = options(1);
    o.precision = precision;
    const auto one = eng::create_model(w, o, "cuda");
    const std::vector<float> ref = scenario(*one, 9);
    for (int tp : {2, 4}) {  // 4 where the machine has four GPUs (issue 27)
      if (tp > flashlite::cuda_device_count()) continue;
      o.tp = tp;
      o.cuda.one_shot_allreduce = true;
      const auto split = eng::create_model(w, o, "cuda");
      const double tol = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
      const std::vector<float> got = scenario(*split, 9);
      EXPECT_LE(max_rel_diff(got, ref), tol) << precision << " tp " << tp;
      std::printf("tp %d %s: %s\n", tp, precision, split->device().c_str());
      // The one-shot kernel (decode steps) against NCCL alone: at TP 2 a + b either way, so the same bits.
      o.cuda.one_shot_allreduce = false;
      const auto nccl = eng::create_model(w, o, "cuda");
      EXPECT_EQ(nccl->device().find("one-shot"), std::string::npos) << nccl->device();
      const std::vector<float> by_nccl = scenario(*nccl, 9);
      if (tp == 2) EXPECT_EQ(got, by_nccl) << precision;
      else EXPECT_LE(max_rel_diff(by_nccl, ref), tol) << precision << " tp " << tp;
    }
  }
}

}  // namespace
