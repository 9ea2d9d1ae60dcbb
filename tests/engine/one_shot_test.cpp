// The one-shot all-reduce (engine/parallel/one_shot.cu) on its own, on every GPU of the machine (2 or more with peer
// access; skipped otherwise): many rounds of random sizes, so that the elements' round counters and inbox halves drift
// apart, eagerly and replayed from CUDA graphs, and sums that the engine's GEMV does itself (peer_sum.h).
// Each rank's x must end as x + the sum over ranks of the partials added in rank order (computed here in fp32 in the
// same order: the same bits), and every partial must be zeroed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "engine/cuda_ops/gemv.h"
#include "engine/parallel/collective.h"
#include "engine/parallel/one_shot.h"

namespace {

namespace eng = flashlite::engine;

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

struct Rank {
  float* x = nullptr;
  float* partial = nullptr;
  cudaStream_t stream = nullptr;
};

class OneShotCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs two CUDA devices";
    std::vector<int> devices;
    for (int d = 0; d < std::min(n, eng::OneShotSum::kMaxRanks); ++d) devices.push_back(d);
    sum_ = eng::OneShotSum::create(devices);
    if (!sum_) GTEST_SKIP() << "no peer access between the GPUs: NCCL does every sum";
    ranks_.resize(devices.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ok(cudaSetDevice(int(r)));
      ok(cudaMalloc(&ranks_[r].x, kMax * sizeof(float)));
      ok(cudaMalloc(&ranks_[r].partial, kMax * sizeof(float)));
      ok(cudaStreamCreateWithFlags(&ranks_[r].stream, cudaStreamNonBlocking));
    }
  }
  void TearDown() override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      cudaSetDevice(int(r));
      cudaFree(ranks_[r].x);
      cudaFree(ranks_[r].partial);
      if (ranks_[r].stream) cudaStreamDestroy(ranks_[r].stream);
    }
    cudaSetDevice(0);
  }

  // One round: random partials and x (the same x on every rank, as the residual stream is), the sums queued on every
  // rank (each kernel spins until its peers' have run, so all are queued before any is waited for), then checked.
  void round(size_t n, std::mt19937& rng) {
    const std::vector<float> want = upload(n, rng);
    for (int r = 0; r < int(ranks_.size()); ++r) {
      ok(cudaSetDevice(r));
      sum_->sum_into(r, ranks_[r].x, ranks_[r].partial, n, ranks_[r].stream);
    }
    expect(n, want);
  }

  // x + the sum over ranks of part[r], added in rank order in fp32 (the bits every rank must get).
  static std::vector<float> plus_rank_order_sum(const std::vector<float>& x,
                                                const std::vector<std::vector<float>>& part) {
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      float s = 0.f;
      for (const auto& p : part) s += p[i];
      want[i] = x[i] + s;
    }
    return want;
  }

  // Random x (the same on every rank) and partials queued on the ranks' streams; returns x + the rank-order sum.
  std::vector<float> upload(size_t n, std::mt19937& rng) {
    const int R = int(ranks_.size());
    std::normal_distribution<float> g;
    std::vector<std::vector<float>> part(R, std::vector<float>(n));
    std::vector<float> x(n);
    for (float& v : x) v = g(rng);
    for (auto& p : part)
      for (float& v : p) v = g(rng);
    const std::vector<float> want = plus_rank_order_sum(x, part);
    for (int r = 0; r < R; ++r) {
      ok(cudaSetDevice(r));
      ok(cudaMemcpyAsync(ranks_[r].x, x.data(), n * 4, cudaMemcpyHostToDevice, ranks_[r].stream));
      ok(cudaMemcpyAsync(ranks_[r].partial, part[r].data(), n * 4, cudaMemcpyHostToDevice, ranks_[r].stream));
      ok(cudaStreamSynchronize(ranks_[r].stream));  // pageable host memory: the vectors die on return
    }
    return want;
  }

  void expect(size_t n, const std::vector<float>& want) {
    for (int r = 0; r < int(ranks_.size()); ++r) {
      ok(cudaSetDevice(r));
      ok(cudaStreamSynchronize(ranks_[r].stream));
      EXPECT_NO_THROW(sum_->check(r));
      std::vector<float> got(n), left(n, -1.f);
      ok(cudaMemcpy(got.data(), ranks_[r].x, n * 4, cudaMemcpyDeviceToHost));
      ok(cudaMemcpy(left.data(), ranks_[r].partial, n * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], want[i]) << "rank " << r << " n " << n << " i " << i;
        ASSERT_EQ(left[i], 0.f) << "rank " << r << " n " << n << " i " << i << ": the partial is not zeroed";
      }
    }
  }

  static constexpr size_t kMax = eng::OneShotSum::kMaxFloats;
  std::unique_ptr<eng::OneShotSum> sum_;
  std::vector<Rank> ranks_;
};

TEST_F(OneShotCuda, RandomSizesSumInRankOrderAndZeroThePartials) {
  std::mt19937 rng(7);
  // The decode step's sizes (hidden 4096 at 1-4 rows) between odd ones: a block that sits out some rounds must
  // still meet its peers' blocks at the same round.
  std::vector<size_t> sizes = {4096, 16384, 4, 1028, 8192, 4096, 12, 16384, 2048, 4096};
  std::uniform_int_distribution<size_t> any(1, kMax / 4);
  for (int k = 0; k < 30; ++k) sizes.push_back(4 * any(rng));
  for (size_t n : sizes) {
    round(n, rng);
    if (HasFatalFailure()) return;
  }
}

TEST_F(OneShotCuda, GraphReplaysMatchEagerRounds) {
  // A graph of three sums per rank (as a decode step's graph holds 64), replayed: each replay is three new rounds.
  const int R = int(ranks_.size());
  const size_t n = 4096;
  std::vector<cudaGraphExec_t> exec(R, nullptr);
  for (int r = 0; r < R; ++r) {
    ok(cudaSetDevice(r));
    cudaGraph_t graph = nullptr;
    ok(cudaStreamBeginCapture(ranks_[r].stream, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < 3; ++k) sum_->sum_into(r, ranks_[r].x, ranks_[r].partial, n, ranks_[r].stream);
    ok(cudaStreamEndCapture(ranks_[r].stream, &graph));
    ok(cudaGraphInstantiate(&exec[r], graph, 0));
    ok(cudaGraphDestroy(graph));
  }
  std::mt19937 rng(11);
  for (int replay = 0; replay < 4; ++replay) {
    // Random x and partials; the three sums give x + S, then add zeros twice (each zeroes the partial it read).
    const std::vector<float> want = upload(n, rng);
    for (int r = 0; r < R; ++r) {
      ok(cudaSetDevice(r));
      ok(cudaGraphLaunch(exec[r], ranks_[r].stream));
    }
    expect(n, want);
    if (HasFatalFailure()) break;
    // An eager round between replays: the graph's rounds and the eager ones share the counters.
    round(4096, rng);
    if (HasFatalFailure()) break;
  }
  for (int r = 0; r < R; ++r) {
    cudaSetDevice(r);
    cudaGraphExecDestroy(exec[r]);
  }
}

// The engine's form: each rank's O / down GEMV sums its outputs over the ranks and adds them to x itself (peer_sum.h).
// Sizes and row counts vary and one-shot kernel sums come between, which share the inboxes and round counters; in the
// second pass the odd ranks take the kernel (a GEMV into the partial, then sum_into) in the very rounds where the even
// ones sum in their GEMVs (--profile's form against the graphs'). The partials are what the same GEMV makes alone.
TEST_F(OneShotCuda, GemvSumsOverTheRanksItself) {
  namespace ops = flashlite::engine::cuda_ops;
  const int R = int(ranks_.size());
  const int k = 520;  // not a multiple of the GEMV's chunk batches
  std::mt19937 rng(13);
  std::normal_distribution<float> g;
  auto bf16 = [&](size_t n) {  // random bf16 (the top half of a float)
    std::vector<uint16_t> v(n);
    for (uint16_t& b : v) {
      const float f = g(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      b = uint16_t(u >> 16);
    }
    return v;
  };
  std::vector<void*> w(R), a(R);
  std::vector<float*> made(R);
  for (int r = 0; r < R; ++r) {
    ok(cudaSetDevice(r));
    ok(cudaMalloc(&w[r], size_t(kMax) * k * 2 / 4));  // out <= 4096 rows of k
    ok(cudaMalloc(&a[r], size_t(4) * k * 2));
    ok(cudaMalloc(&made[r], kMax * sizeof(float)));
  }
  const struct {
    int rows, out;
  } shapes[] = {{1, 4096}, {4, 4096}, {1, 1028}, {3, 2044}, {2, 4096}, {1, 4096}, {4, 12}};
  int plain = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (const auto& sh : shapes) {
      const size_t n = size_t(sh.rows) * sh.out;
      std::vector<std::vector<float>> part(R, std::vector<float>(n));
      auto params = [&](int r, float* y, bool fused) {
        ops::GemvParams p;
        p.w = w[r];
        p.out = sh.out;
        p.k = k;
        p.rows = sh.rows;
        p.x = a[r];
        p.epi = fused ? ops::GemvOut::sum_f32 : ops::GemvOut::add_f32;
        p.y = y;
        p.split = ops::gemv_auto_split(sh.out, k);
        if (fused) p.sum = sum_->fused_target(r);
        return p;
      };
      for (int r = 0; r < R; ++r) {  // each rank's partial, made alone
        ok(cudaSetDevice(r));
        const std::vector<uint16_t> wh = bf16(size_t(sh.out) * k), ah = bf16(size_t(sh.rows) * k);
        ok(cudaMemcpy(w[r], wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
        ok(cudaMemcpy(a[r], ah.data(), ah.size() * 2, cudaMemcpyHostToDevice));
        ok(cudaMemset(made[r], 0, n * 4));
        ops::gemv(params(r, made[r], false), ranks_[r].stream);
        ok(cudaStreamSynchronize(ranks_[r].stream));
        ok(cudaMemcpy(part[r].data(), made[r], n * 4, cudaMemcpyDeviceToHost));
      }
      std::vector<float> x(n);
      for (float& v : x) v = g(rng);
      const std::vector<float> want = plus_rank_order_sum(x, part);
      for (int r = 0; r < R; ++r) {
        ok(cudaSetDevice(r));
        ok(cudaMemcpy(ranks_[r].x, x.data(), n * 4, cudaMemcpyHostToDevice));
        ok(cudaMemset(ranks_[r].partial, 0, n * 4));
      }
      for (int r = 0; r < R; ++r) {  // every rank queued before any is waited for
        ok(cudaSetDevice(r));
        if (pass == 1 && r % 2 == 1) {
          ops::gemv(params(r, ranks_[r].partial, false), ranks_[r].stream);
          sum_->sum_into(r, ranks_[r].x, ranks_[r].partial, n, ranks_[r].stream);
        } else {
          ops::gemv(params(r, ranks_[r].x, true), ranks_[r].stream);
        }
      }
      expect(n, want);
      if (HasFatalFailure()) break;
      if (++plain % 2 == 0) round(4 * (1 + rng() % (kMax / 4)), rng);  // a one-shot kernel sum between
      if (HasFatalFailure()) break;
    }
  }
  for (int r = 0; r < R; ++r) {
    cudaSetDevice(r);
    cudaFree(w[r]);
    cudaFree(a[r]);
    cudaFree(made[r]);
  }
}

// A rank whose peers never come (they failed before their sum): abort() releases its kernel, or its GEMV waiting in
// every warp, within milliseconds, not the 20 s timeout, and check() reports the abort.
TEST_F(OneShotCuda, AbortReleasesARankWhosePeersNeverCame) {
  ok(cudaSetDevice(0));
  const auto t0 = std::chrono::steady_clock::now();
  sum_->sum_into(0, ranks_[0].x, ranks_[0].partial, 4096, ranks_[0].stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaStreamQuery(ranks_[0].stream), cudaErrorNotReady);  // still waiting for its peers
  sum_->abort();
  ok(cudaStreamSynchronize(ranks_[0].stream));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_THROW(sum_->check(0), eng::CollectiveAborted);
}

TEST_F(OneShotCuda, AbortReleasesAGemvWhosePeersNeverCame) {
  namespace ops = flashlite::engine::cuda_ops;
  ok(cudaSetDevice(0));
  const int out = 4096, k = 512, rows = 2;
  void* w = nullptr;
  void* a = nullptr;
  ok(cudaMalloc(&w, size_t(out) * k * 2));
  ok(cudaMalloc(&a, size_t(rows) * k * 2));
  ok(cudaMemset(w, 0, size_t(out) * k * 2));
  ok(cudaMemset(a, 0, size_t(rows) * k * 2));
  ops::GemvParams p;
  p.w = w;
  p.out = out;
  p.k = k;
  p.rows = rows;
  p.x = a;
  p.epi = ops::GemvOut::sum_f32;
  p.y = ranks_[0].x;
  p.split = ops::gemv_auto_split(out, k);
  p.sum = sum_->fused_target(0);
  const auto t0 = std::chrono::steady_clock::now();
  ops::gemv(p, ranks_[0].stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaStreamQuery(ranks_[0].stream), cudaErrorNotReady);  // every warp waits for its peers
  sum_->abort();
  ok(cudaStreamSynchronize(ranks_[0].stream));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_THROW(sum_->check(0), eng::CollectiveAborted);
  cudaFree(w);
  cudaFree(a);
}

}  // namespace
