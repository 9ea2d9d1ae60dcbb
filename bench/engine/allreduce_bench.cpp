// The decode step's all-reduce timed alone on the GPUs of one machine (2 or more with NVLink; nothing to time
// otherwise): the one-shot kernel (engine/parallel/one_shot.cu), with and without programmatic dependent launch,
// and NCCL's all-reduce, each as a CUDA graph of 64 sums (a Llama-3-8B decode step holds 64) replayed on every rank
// at once. Prints one JSON line per (ranks, floats, path): microseconds per sum, median of 5 timed sets of 10 replays
// on rank 0's stream. Nothing is checked here: tests/engine/one_shot_test.cpp holds the sums.
//
//   flashlite_engine_allreduce_bench [--floats 4096,16384]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/parallel/collective.h"
#include "engine/parallel/nccl_group.h"
#include "engine/parallel/one_shot.h"
#include "engine/parallel/rank_threads.h"

namespace {

namespace eng = flashlite::engine;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "allreduce_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kSums = 64, kReplays = 10, kSets = 5;

struct Rank {
  float* x = nullptr;
  float* partial = nullptr;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<float> ms;
};

// Captures `sums` on every rank (each on its own thread), replays it on all ranks at once, returns us per sum.
double time_graphs(eng::RankThreads& threads, std::vector<Rank>& ranks, const std::function<void(int)>& sums) {
  threads.run([&](int r) {
    Rank& k = ranks[r];
    check(cudaSetDevice(r), "device");
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal), "capture");
    sums(r);
    check(cudaStreamEndCapture(k.stream, &g), "end capture");
    check(cudaGraphInstantiate(&k.exec, g, 0), "instantiate");
    cudaGraphDestroy(g);
    k.ms.clear();
  });
  for (int set = -1; set < kSets; ++set) {  // set -1: warm-up
    threads.run([&](int r) {
      Rank& k = ranks[r];
      cudaEvent_t a, b;
      cudaEventCreate(&a), cudaEventCreate(&b);
      cudaEventRecord(a, k.stream);
      for (int i = 0; i < kReplays; ++i) check(cudaGraphLaunch(k.exec, k.stream), "replay");
      cudaEventRecord(b, k.stream);
      check(cudaStreamSynchronize(k.stream), "sync");
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (set >= 0) k.ms.push_back(ms);
      cudaEventDestroy(a), cudaEventDestroy(b);
    });
  }
  threads.run([&](int r) { cudaGraphExecDestroy(ranks[r].exec); });
  std::vector<float> ms = ranks[0].ms;
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2] / (kReplays * kSums);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> floats = {4096, 16384};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--floats" && i + 1 < argc) {
      floats.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) floats.push_back(std::stoul(t));
    } else {
      std::fprintf(stderr, "usage: flashlite_engine_allreduce_bench [--floats 4096,16384]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("{\"skipped\": \"needs two CUDA devices\"}\n");
    return 0;
  }
  for (int R = 2; R <= std::min(devices, eng::OneShotSum::kMaxRanks); R *= 2) {
    std::vector<int> ids;
    for (int d = 0; d < R; ++d) ids.push_back(d);
    eng::RankThreads threads(R, true);
    std::vector<Rank> ranks(R);
    threads.run([&](int r) {
      check(cudaSetDevice(r), "device");
      check(cudaMalloc(&ranks[r].x, eng::OneShotSum::kMaxFloats * 4), "malloc");
      check(cudaMalloc(&ranks[r].partial, eng::OneShotSum::kMaxFloats * 4), "malloc");
      check(cudaMemset(ranks[r].x, 0, eng::OneShotSum::kMaxFloats * 4), "memset");
      check(cudaMemset(ranks[r].partial, 0, eng::OneShotSum::kMaxFloats * 4), "memset");
      check(cudaStreamCreateWithFlags(&ranks[r].stream, cudaStreamNonBlocking), "stream");
    });
    auto group = eng::create_nccl_group(0, R, false);  // NCCL alone (the one-shot sums are made below)
    for (size_t n : floats) {
      for (bool pdl : {true, false}) {
        auto one_shot = eng::OneShotSum::create(ids, pdl);
        if (!one_shot) {
          std::printf("{\"ranks\": %d, \"skipped\": \"no peer access\"}\n", R);
          break;
        }
        const double us = time_graphs(threads, ranks, [&](int r) {
          for (int s = 0; s < kSums; ++s) one_shot->sum_into(r, ranks[r].x, ranks[r].partial, n, ranks[r].stream);
        });
        std::printf("{\"ranks\": %d, \"floats\": %zu, \"path\": \"one-shot%s\", \"us_per_sum\": %.2f}\n", R, n,
                    pdl ? "" : " (no PDL)", us);
        std::fflush(stdout);
      }
      const double us = time_graphs(threads, ranks, [&](int r) {
        for (int s = 0; s < kSums; ++s)
          group->member(r).all_reduce_sum(ranks[r].partial, n, flashlite::DType::f32, ranks[r].stream);
      });
      std::printf("{\"ranks\": %d, \"floats\": %zu, \"path\": \"NCCL\", \"us_per_sum\": %.2f}\n", R, n, us);
      std::fflush(stdout);
    }
    threads.run([&](int r) {
      cudaFree(ranks[r].x);
      cudaFree(ranks[r].partial);
      cudaStreamDestroy(ranks[r].stream);
    });
  }
  return 0;
}
