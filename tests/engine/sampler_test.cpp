// The sampler: greedy is argmax (first index on ties); temperature sampling follows softmax(logits / T) in frequency;
// top-k and top-p keep exactly the tokens they should; seeds reproduce; bad parameters are errors; the repeat and
// frequency penalties match a plain computation.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <random>

#include "engine/model.h"
#include "engine/sampler.h"
#include "flashlite/errors.h"

namespace {

namespace eng = flashlite::engine;

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  std::vector<float> v = random_logits(1000, 1);
  const int best = int(std::max_element(v.begin(), v.end()) - v.begin());
  eng::Sampler s({0.f, 0, 1.f, 0}, 0);
  EXPECT_EQ(s.sample(v.data(), 1000), best);
  std::vector<float> ties{1.f, 3.f, 3.f, 2.f};
  EXPECT_EQ(s.sample(ties.data(), 4), 1);
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperature) {
  const std::vector<float> logits{0.5f, -1.f, 2.f, 0.f, 1.f, -0.5f};
  const float T = 0.7f;
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] / T);
  eng::Sampler s({T, 0, 1.f, 7}, 0);
  const int n = 200000;
  std::vector<int> count(logits.size());
  for (int i = 0; i < n; ++i) ++count[s.sample(logits.data(), int(logits.size()))];
  for (size_t i = 0; i < p.size(); ++i) {
    const double want = p[i] / z, got = double(count[i]) / n;
    // 5 standard deviations of a binomial proportion.
    EXPECT_NEAR(got, want, 5 * std::sqrt(want * (1 - want) / n)) << "token " << i;
  }
}

TEST(Sampler, TopKAndTopPKeepTheRightSet) {
  const std::vector<float> logits{1.f, 4.f, 3.f, 2.f, 0.f};  // order: 1, 2, 3, 0, 4
  eng::Sampler k2({1.f, 2, 1.f, 3}, 0);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[k2.sample(logits.data(), 5)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(2));
  // probabilities at T=1: token 1 ~0.644, token 2 ~0.237: top_p 0.7 keeps {1, 2}, top_p 0.5 keeps {1}.
  eng::Sampler p7({1.f, 0, 0.7f, 3}, 0);
  seen.clear();
  for (int i = 0; i < 2000; ++i) ++seen[p7.sample(logits.data(), 5)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(2));
  eng::Sampler p5({1.f, 0, 0.5f, 3}, 0);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(p5.sample(logits.data(), 5), 1);
}

TEST(Sampler, SeedsReproduceAndStreamsDiffer) {
  const std::vector<float> v = random_logits(300, 2);
  auto draw = [&](uint64_t seed, uint64_t stream) {
    eng::Sampler s({1.f, 0, 1.f, seed}, stream);
    std::vector<int> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(v.data(), 300));
    return out;
  };
  EXPECT_EQ(draw(5, 0), draw(5, 0));
  EXPECT_NE(draw(5, 0), draw(6, 0));
  EXPECT_NE(draw(5, 0), draw(5, 1));
}

TEST(Sampler, BadParametersAreErrors) {
  EXPECT_THROW(eng::Sampler({-1.f, 0, 1.f, 0}, 0), flashlite::Error);
  EXPECT_THROW(eng::Sampler({NAN, 0, 1.f, 0}, 0), flashlite::Error);
  EXPECT_THROW(eng::Sampler({1.f, -2, 1.f, 0}, 0), flashlite::Error);
  EXPECT_THROW(eng::Sampler({1.f, 0, 0.f, 0}, 0), flashlite::Error);
  EXPECT_THROW(eng::Sampler({1.f, 0, 1.5f, 0}, 0), flashlite::Error);
  try {
    eng::SamplingParams{1.f, 0, 1.5f, 0}.validate();
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p is 1.5"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// Top-p against a brute-force nucleus over a large random vocabulary: the kept set must be exactly the smallest prefix
// (by probability) whose mass reaches top_p, whatever the engine's shortcuts.
TEST(Sampler, TopPMatchesBruteForceNucleus) {
  const int V = 2000;
  std::vector<float> v = random_logits(V, 11);
  for (float top_p : {0.3f, 0.9f, 0.99f}) {
    std::vector<std::pair<double, int>> p(V);
    double z = 0;
    for (int i = 0; i < V; ++i) z += std::exp(double(v[i]) / 0.8);
    for (int i = 0; i < V; ++i) p[i] = {std::exp(double(v[i]) / 0.8) / z, i};
    std::sort(p.begin(), p.end(), [](auto a, auto b) { return a.first > b.first; });
    std::set<int> nucleus;
    double cum = 0;
    for (const auto& [prob, id] : p) {
      nucleus.insert(id);
      cum += prob;
      if (cum >= top_p) break;
    }
    eng::Sampler s({0.8f, 0, top_p, 9}, 0);
    std::set<int> seen;
    for (int i = 0; i < 4000; ++i) {
      const int t = s.sample(v.data(), V);
      ASSERT_TRUE(nucleus.count(t)) << "token " << t << " is outside the top_p " << top_p << " nucleus";
      seen.insert(t);
    }
    if (nucleus.size() <= 20) {
      EXPECT_EQ(seen.size(), nucleus.size()) << "top_p " << top_p;
    }
  }
}

// The top-k path from candidates (what a model that selects on its device hands back, in any order) draws exactly
// what the full-row sampler draws with the same seed; ties at the k-th value keep the lowest ids.
TEST(Sampler, TopKFromCandidatesEqualsFullRow) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> level(-30, 30);
  const int vocab = 700;
  for (const auto& sp : {eng::SamplingParams{0.7f, 10, 1.f, 4}, eng::SamplingParams{1.5f, 100, 0.8f, 5},
                         eng::SamplingParams{0.f, 3, 1.f, 6}}) {
    std::vector<float> logits(vocab);
    for (float& x : logits) x = level(rng) * 0.25f;  // many ties
    std::vector<std::pair<float, int>> cand(vocab);
    for (int i = 0; i < vocab; ++i) cand[i] = {logits[i], i};
    std::partial_sort(cand.begin(), cand.begin() + sp.top_k, cand.end(), eng::Sampler::before);
    cand.resize(sp.top_k);
    std::shuffle(cand.begin(), cand.end(), rng);
    std::vector<float> values;
    std::vector<int32_t> ids;
    for (const auto& [v, i] : cand) {
      values.push_back(v);
      ids.push_back(i);
    }
    eng::Sampler full(sp, 2), from(sp, 2);
    for (int draw = 0; draw < 300; ++draw) {
      ASSERT_EQ(from.sample_top_k(values.data(), ids.data(), sp.top_k), full.sample(logits.data(), vocab)) << draw;
    }
  }
}

// A NaN or +inf logit is a broken model or kernel, not a distribution: every mode says so instead of reading out of
// its candidate list (top-p's floor was NaN) or picking a token silently; so does a row of -inf only. -inf entries
// next to finite ones are ordinary masked tokens.
TEST(Sampler, NonFiniteRowsAreErrors) {
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<eng::SamplingParams> modes = {
      {0.f, 0, 1.f, 0}, {0.8f, 0, 1.f, 1}, {0.8f, 0, 0.9f, 2}, {0.8f, 5, 1.f, 3}, {0.8f, 5, 0.9f, 4}};
  for (const eng::SamplingParams& m : modes) {
    SCOPED_TRACE("temperature " + std::to_string(m.temperature) + " top_k " + std::to_string(m.top_k) + " top_p " +
                 std::to_string(m.top_p));
    eng::Sampler s(m, 0);
    for (float badv : {nan, inf}) {
      std::vector<float> v = random_logits(100, 7);
      v[37] = badv;
      try {
        (void)s.sample(v.data(), 100);
        ADD_FAILURE() << "a row with " << badv << " at 37 was sampled";
      } catch (const flashlite::Error& e) {
        EXPECT_NE(std::string(e.what()).find("logit 37 is"), std::string::npos) << e.what();
      }
    }
    std::vector<float> all_masked(50, -inf);
    EXPECT_THROW((void)s.sample(all_masked.data(), 50), flashlite::Error);
    std::vector<float> some_masked = random_logits(50, 9);
    for (int i = 0; i < 50; i += 2) some_masked[size_t(i)] = -inf;
    for (int rep = 0; rep < 20; ++rep) EXPECT_EQ(s.sample(some_masked.data(), 50) % 2, 1);
    const std::vector<float> values{2.f, nan, 1.f};
    const std::vector<int32_t> ids{4, 9, 1};
    EXPECT_THROW((void)s.sample_top_k(values.data(), ids.data(), 3), flashlite::Error);
  }
}

// Every selection path names a refused row the same way: the lowest-id NaN if any, else the lowest-id +inf; top-k
// candidates (in any order) by their vocabulary ids, not their slots.
TEST(Sampler, RefusalsNameTheLowestIdNaNThenInf) {
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<float> row = random_logits(100, 5);
  row[12] = inf, row[40] = nan, row[70] = nan;
  EXPECT_EQ(eng::unsampleable(row.data(), 100, "logit").rfind("logit 40 is NaN", 0), 0u);
  row[40] = 1.f, row[70] = 1.f;
  row[90] = inf;
  EXPECT_EQ(eng::unsampleable(row.data(), 100, "logit").rfind("logit 12 is +inf", 0), 0u);
  const std::vector<float> values{2.f, nan, inf, nan, 1.f};
  const std::vector<int32_t> ids{4, 900, 3, 77, 1};
  eng::Sampler s({0.8f, 5, 1.f, 1}, 0);
  try {
    (void)s.sample_top_k(values.data(), ids.data(), 5);
    ADD_FAILURE() << "candidates with NaN were sampled";
  } catch (const flashlite::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("logit 77 is NaN", 0), 0u) << e.what();
  }
  const std::vector<float> masked(4, -inf);
  EXPECT_EQ(eng::unsampleable(masked.data(), 4, "logit", ids.data()), "every logit is -inf: no token can be sampled");
}

}  // namespace

namespace {

// The penalties written out plainly (llama.cpp's repeat and frequency, OpenAI's presence): each vocabulary id counted
// in the window by a linear scan.
std::vector<float> penalized_by_hand(std::vector<float> logits, const std::vector<int>& history,
                                     const eng::SamplingParams& p) {
  const size_t n = p.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.repeat_last_n));
  const std::vector<int> window(history.end() - std::ptrdiff_t(n), history.end());
  for (int id = 0; id < int(logits.size()); ++id) {
    const int count = int(std::count(window.begin(), window.end(), id));
    if (count == 0) continue;
    float x = logits[size_t(id)];
    x = x <= 0 ? x * p.repeat_penalty : x / p.repeat_penalty;
    logits[size_t(id)] = x - float(count) * p.frequency_penalty - p.presence_penalty;
  }
  return logits;
}

eng::SamplingParams penalized(float temperature, int top_k, float top_p, uint64_t seed, float repeat, int last_n,
                              float frequency, float presence = 0.f) {
  eng::SamplingParams p{temperature, top_k, top_p, seed};
  p.repeat_penalty = repeat;
  p.repeat_last_n = last_n;
  p.frequency_penalty = frequency;
  p.presence_penalty = presence;
  return p;
}

TEST(SamplerPenalties, MatchAPlainComputation) {
  const int vocab = 300;
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> id(-5, 60);  // repeats, and ids outside the vocabulary (ignored)
  for (const auto& p : {penalized(0.f, 0, 1.f, 0, 1.3f, 64, 0.f), penalized(0.f, 0, 1.f, 0, 1.f, 64, 0.5f),
                        penalized(0.f, 0, 1.f, 0, 1.2f, 16, -0.7f), penalized(0.f, 0, 1.f, 0, 0.8f, -1, 0.3f),
                        penalized(0.f, 0, 1.f, 0, 1.5f, 1, 1.f), penalized(0.f, 0, 1.f, 0, 1.f, -1, 0.f, 1.3f),
                        penalized(0.f, 0, 1.f, 0, 1.f, 32, 0.4f, -0.6f)}) {
    SCOPED_TRACE("repeat " + std::to_string(p.repeat_penalty) + " last_n " + std::to_string(p.repeat_last_n) +
                 " frequency " + std::to_string(p.frequency_penalty) + " presence " +
                 std::to_string(p.presence_penalty));
    const std::vector<float> logits = random_logits(vocab, 12);
    std::vector<int> history(150);
    for (int& t : history) t = id(rng);
    const std::vector<float> want = penalized_by_hand(logits, history, p);
    const size_t n = p.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.repeat_last_n));
    std::vector<float> got = logits;
    eng::apply_penalties(got.data(), vocab, history.data() + history.size() - n, n, p);
    for (int i = 0; i < vocab; ++i) ASSERT_FLOAT_EQ(got[size_t(i)], want[size_t(i)]) << "token " << i;
    EXPECT_NE(got, logits) << "the history must change the row";
  }
}

// The penalized sampler draws what an unpenalized sampler with the same seed draws from the hand-penalized row, step
// after step while its window slides over the tokens it accepted (the prompt's first, then its own draws).
TEST(SamplerPenalties, SamplingEqualsSamplingTheHandPenalizedRow) {
  const int vocab = 200;
  const std::vector<float> logits = random_logits(vocab, 14);
  for (const auto& p : {penalized(0.f, 0, 1.f, 0, 1.4f, 8, 0.2f), penalized(0.9f, 0, 1.f, 3, 1.3f, 64, 0.f),
                        penalized(0.9f, 20, 0.9f, 4, 1.1f, 32, 0.4f), penalized(1.2f, 0, 0.8f, 5, 2.f, -1, 0.f),
                        penalized(0.f, 0, 1.f, 0, 1.f, -1, 0.3f, 0.9f),
                        penalized(0.8f, 0, 1.f, 7, 1.f, 40, 0.f, 1.5f)}) {
    SCOPED_TRACE("temperature " + std::to_string(p.temperature) + " last_n " + std::to_string(p.repeat_last_n));
    eng::SamplingParams plain = p;
    plain.repeat_penalty = 1.f, plain.frequency_penalty = 0.f, plain.presence_penalty = 0.f;
    eng::Sampler with(p, 1), without(plain, 1);
    std::vector<int> history = {5, 9, 5, 17};
    for (int t : history) with.accept(t);
    std::set<int> drawn;
    for (int step = 0; step < 150; ++step) {
      const std::vector<float> row = penalized_by_hand(logits, history, p);
      const int want = without.sample(row.data(), vocab);
      const int got = with.sample(logits.data(), vocab);
      ASSERT_EQ(got, want) << "step " << step;
      with.accept(got);
      history.push_back(got);
      drawn.insert(got);
    }
    EXPECT_GT(drawn.size(), 3u) << "the penalties must move the draws off the favourite tokens";
  }
}

TEST(SamplerPenalties, OffLeavesDrawsAlone) {
  const std::vector<float> logits = random_logits(100, 15);
  for (const auto& p : {penalized(0.8f, 0, 1.f, 6, 1.f, 64, 0.f), penalized(0.8f, 0, 1.f, 6, 1.7f, 0, 0.9f, 1.f)}) {
    EXPECT_FALSE(p.penalizes());
    eng::Sampler a(p, 0), b({0.8f, 0, 1.f, 6}, 0);
    for (int i = 0; i < 100; ++i) {
      const int t = a.sample(logits.data(), 100);
      ASSERT_EQ(t, b.sample(logits.data(), 100));
      a.accept(t);
    }
  }
  // With penalties the host needs the full row: no device argmax / top-k shortcut.
  EXPECT_EQ(eng::logits_request_for(penalized(0.f, 0, 1.f, 0, 1.2f, 64, 0.f), 100).kind, eng::LogitsRequest::Kind::logits);
  EXPECT_EQ(eng::logits_request_for(penalized(0.5f, 10, 1.f, 0, 1.f, 64, 0.3f), 100).kind, eng::LogitsRequest::Kind::logits);
  EXPECT_EQ(eng::logits_request_for(penalized(0.f, 0, 1.f, 0, 1.f, 64, 0.f), 100).kind, eng::LogitsRequest::Kind::argmax);
}

TEST(SamplerPenalties, BadValuesAreErrorsNamingThem) {
  const struct {
    eng::SamplingParams p;
    const char* names;
  } cases[] = {{penalized(0.f, 0, 1.f, 0, 0.f, 64, 0.f), "repeat_penalty is 0"},
               {penalized(0.f, 0, 1.f, 0, -1.f, 64, 0.f), "repeat_penalty is -1"},
               {penalized(0.f, 0, 1.f, 0, NAN, 64, 0.f), "repeat_penalty is nan"},
               {penalized(0.f, 0, 1.f, 0, 1000.f, 64, 0.f), "repeat_penalty is 1000"},
               {penalized(0.f, 0, 1.f, 0, 1.1f, -2, 0.f), "repeat_last_n is -2"},
               {penalized(0.f, 0, 1.f, 0, 1.f, 64, 3.f), "frequency_penalty is 3"},
               {penalized(0.f, 0, 1.f, 0, 1.f, 64, NAN), "frequency_penalty is nan"}};
  for (const auto& c : cases) {
    try {
      c.p.validate();
      ADD_FAILURE() << c.names << " was accepted";
    } catch (const flashlite::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.names), std::string::npos) << e.what();
    }
  }
  eng::Sampler s(penalized(0.8f, 5, 1.f, 0, 1.2f, 64, 0.f), 0);
  const std::vector<float> values{2.f, 1.f};
  const std::vector<int32_t> ids{4, 9};
  EXPECT_THROW((void)s.sample_top_k(values.data(), ids.data(), 2), flashlite::Error);
}

}  // namespace
